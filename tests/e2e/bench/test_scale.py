"""The scale benchmark's measuring functions at a tiny N, on one server process: every rollout
really waits in a sandbox at the gate at once (the positive control for ``in_flight``), the
figures come out finite, and the server process leaves no sandbox behind; and ``bench.workers``
at its smallest."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest

from bench.env import managed_containers
from bench.scale import Sizes
from bench.server_proc import ServerProcess, ServerSpec
from osmosis_harbor.testing.scripted_policy import FakeChatServer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


async def test_the_cpu_and_scale_phases_measure_on_one_server_and_leave_nothing(
    tmp_path: Path, fake_chat: FakeChatServer
) -> None:
    """Both of the scale benchmark's measurements on one graded server process (``measure_scale``,
    then ``measure_cpu`` without its warm-ups, the server being warm; the benchmark gives each a
    server of its own, ``scale_phase`` and ``cpu_phase``, which differ from this only in starting it).

    N gated rollouts: every one waited in its sandbox at the gate at once, the figures are finite,
    the loop's probe ran during the window. Where a graded rollout's host CPU goes by thread
    (docs/performance.md's split): the event loop, the default executor behind ``to_thread``, the
    Docker SDK's pool and the policy relay each spent some, named by family (no worker numbers), and
    the families add up to the total. The server left no sandbox."""
    import re

    from bench.scale import measure_cpu, measure_scale

    size = Sizes(n=3, cpu_rollouts=0, idle_window_sec=1.0, ramp_timeout_sec=240.0)
    spec = ServerSpec(Path(tempfile.mkdtemp(prefix="scale-", dir=tmp_path)), n_concurrent=4, graded=True)
    async with ServerProcess(spec) as server:
        figures = await measure_scale(server, fake_chat, size)
        cpu = await measure_cpu(server, fake_chat, 2, warm_ups=0)

    split = cpu.per_rollout_by_thread_s
    assert cpu.per_rollout_s > 0
    for family in ("MainThread", "asyncio", "osmosis-docker-sdk", "osmosis-policy-relay"):
        assert split.get(family, 0) > 0, (family, split)
    assert not [name for name in split if re.search(r"[_-]\d+$", name)]
    assert split["MainThread"] < cpu.per_rollout_s
    assert sum(split.values()) == pytest.approx(cpu.per_rollout_s, abs=0.011)  # a clock tick per thread family

    assert figures.server_pid == server.pid > 0
    assert figures.in_flight == 3  # all three workflows were waiting at the gate at once
    assert figures.completed == 3 and figures.failed == 0
    for value in (
        figures.host_cpu_per_rollout_s,
        figures.idle_cpu_ms_per_rollout_s,
        figures.rss_mib_per_rollout,
        figures.loop_lag_p99_ms,
    ):
        assert math.isfinite(value)
    assert figures.host_cpu_per_rollout_s > 0
    assert figures.lag_samples_ms  # the probe ran on the server's loop during the window
    assert server.removed == []  # closing the server found nothing of its pid left
    assert managed_containers(figures.server_pid) == []


def test_the_scale_figures_land_under_a_top_level_scale_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m bench --only scale`` writes the keys docs/performance.md names under ``"scale"`` at the top level of
    its JSON (as well as in the benchmark's own entry), and prints the targets table from them. The
    benchmark itself is stood in for: what is checked is where its figures land."""
    import json

    import bench.__main__ as bench_main
    from bench.common import BenchResult

    figures = {"in_flight": 3.0, "host_cpu_per_rollout_s": 0.1, "loop_lag_p99_ms": 4.0}

    async def fake_run(quick: bool) -> BenchResult:
        result = BenchResult("scale", "stand-in")
        for key, value in figures.items():
            result.headline_value(key, value)
        return result

    monkeypatch.setattr(bench_main, "load", lambda name, args: fake_run)
    monkeypatch.setattr(bench_main, "hygiene", lambda result: None)
    out = tmp_path / "out.json"
    assert bench_main.main(["--only", "scale", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["scale"] == figures
    assert payload["benchmarks"]["scale"]["headline"] == figures
    assert {row["key"] for row in payload["targets"]} >= set(figures)
    assert "incumbent" not in payload  # only what ran is lifted


async def test_the_workers_figures_at_the_smallest_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench.workers`` at its smallest (``--smallest``): servers of 1 and 2 worker processes (the
    in-flight phase on the 2-worker one, after its batch), every figure the benchmark reports finite
    and under its key, the 2-worker front's CPU below what all its processes spent (the trials' work
    ran in the workers), and nothing left behind."""
    from bench import workers as workers_bench

    monkeypatch.setattr(workers_bench, "workdir", lambda name: tmp_path)
    result = await workers_bench.run(False, smallest=True, workers=2)

    head = result.headline
    assert set(head["completions_per_s"]) == {"1", "2"}
    assert all(v > 0 for v in head["completions_per_s"].values())
    assert result.to_json()["headline"]["completions_per_s"] == head["completions_per_s"]  # what --out writes
    for key in ("front_cpu_per_rollout_s", "total_cpu_per_rollout_s", "single_process_cpu_per_rollout_s"):
        assert head[key] is not None and math.isfinite(head[key]) and head[key] > 0, key
    assert head["front_cpu_per_rollout_s"] < head["total_cpu_per_rollout_s"]
    assert head["in_flight"] == 2.0  # both gated rollouts waited in their sandboxes at once
    assert head["front_loop_lag_p99_ms"] is not None and math.isfinite(head["front_loop_lag_p99_ms"])
    assert not result.warnings, result.warnings  # a leftover of any server process is one
    assert result.info["server_leftovers"] == 0


def test_only_scale_runs_the_workers_benchmark_and_lifts_its_figures(tmp_path: Path, monkeypatch) -> None:
    """``--only scale --workers 3`` runs ``workers`` too, with N=3, and its figures (the
    completions object included) land under the JSON's top-level ``"workers"`` key."""
    import json

    import bench.__main__ as bench_main
    from bench.common import BenchResult

    ran: dict[str, int] = {}

    def fake_load(name: str, args):
        async def fake_run(quick: bool) -> BenchResult:
            ran[name] = args.workers
            result = BenchResult(name, "stand-in")
            result.headline_value("front_cpu_per_rollout_s", 0.01)
            result.headline["completions_per_s"] = {"1": 1.0, "2": 1.5, "3": 1.7}
            return result

        return fake_run

    monkeypatch.setattr(bench_main, "load", fake_load)
    monkeypatch.setattr(bench_main, "hygiene", lambda result: None)
    out = tmp_path / "out.json"
    assert bench_main.main(["--only", "scale", "--workers", "3", "--out", str(out)]) == 0
    assert ran == {"scale": 3, "workers": 3}
    payload = json.loads(out.read_text())
    assert payload["workers"] == {"front_cpu_per_rollout_s": 0.01, "completions_per_s": {"1": 1.0, "2": 1.5, "3": 1.7}}
    assert any(row["key"] == "front_cpu_per_rollout_s" and row["met"] for row in payload["targets"])
