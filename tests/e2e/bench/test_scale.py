"""``bench.workers`` at its smallest, and the scale benchmark's measuring functions at a tiny N on
its single-process server: every rollout really waits in a sandbox at the gate at once (the
positive control for ``in_flight``), the figures come out finite, and no server process leaves a
sandbox behind. Where the figures of both land in ``python -m bench``'s JSON."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.env import managed_containers
from bench.scale import Sizes
from bench.server_proc import ServerProcess, ServerSpec
from osmosis_harbor.testing.scripted_policy import FakeChatServer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


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


async def test_the_workers_figures_at_the_smallest_size_and_the_scale_measurements_on_its_single_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_chat: FakeChatServer
) -> None:
    """``bench.workers`` at its smallest (``--smallest``): servers of 1 and 2 worker processes (the
    in-flight phase on the 2-worker one, after its batch), every figure the benchmark reports finite
    and under its key, the 2-worker front's CPU below what all its processes spent (the trials' work
    ran in the workers), and nothing left behind.

    The scale benchmark's two measurements run on the single-process server after its batch (one
    server process fewer: here it is made graded, with room for N=3, which its ungraded batch does
    not notice; the benchmark gives each measurement a server of its own, ``scale_phase`` and
    ``cpu_phase``, which differ from this only in starting it). ``measure_scale``: N gated rollouts,
    every one waited in its sandbox at the gate at once, the figures finite, the loop's probe ran
    during the window. ``measure_cpu`` (its warm-ups left out, the server being warm): where a
    graded rollout's host CPU goes by thread (docs/performance.md's split): the event loop, the
    default executor behind ``to_thread``, the Docker SDK's pool and the policy relay each spent
    some, named by family (no worker numbers), and the families add up to the total."""
    import re

    from bench import workers as workers_bench
    from bench.scale import CpuFigures, ScaleFigures, measure_cpu, measure_scale

    size = Sizes(n=3, cpu_rollouts=0, idle_window_sec=1.0, ramp_timeout_sec=240.0)
    measured: dict[str, ScaleFigures | CpuFigures] = {}
    measure_throughput = workers_bench.measure_throughput

    def spec(work: Path, n_concurrent: int, workers: int = 1) -> ServerSpec:
        if workers == 1:  # the scale measurements' server too
            return ServerSpec(work, n_concurrent=max(n_concurrent, 4), graded=True)
        return ServerSpec(work, n_concurrent=n_concurrent, workers=workers)

    async def then_scale(
        server: ServerProcess, chat: FakeChatServer, workers: int, rollouts: int
    ) -> workers_bench.Throughput:
        phase = await measure_throughput(server, chat, workers, rollouts)
        if workers == 1:
            measured["scale"] = await measure_scale(server, fake_chat, size)
            measured["cpu"] = await measure_cpu(server, fake_chat, 2, warm_ups=0)
        return phase

    monkeypatch.setattr(workers_bench, "workdir", lambda name: tmp_path)
    monkeypatch.setattr(workers_bench, "ServerSpec", spec)
    monkeypatch.setattr(workers_bench, "measure_throughput", then_scale)
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
    assert result.info["server_leftovers"] == 0  # the scale measurements' server's included

    figures, cpu = measured["scale"], measured["cpu"]
    assert isinstance(figures, ScaleFigures) and isinstance(cpu, CpuFigures)
    assert figures.server_pid > 0
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
    assert managed_containers(figures.server_pid) == []

    split = cpu.per_rollout_by_thread_s
    assert cpu.per_rollout_s > 0
    for family in ("MainThread", "asyncio", "osmosis-docker-sdk", "osmosis-policy-relay"):
        assert split.get(family, 0) > 0, (family, split)
    assert not [name for name in split if re.search(r"[_-]\d+$", name)]
    assert split["MainThread"] < cpu.per_rollout_s
    assert sum(split.values()) == pytest.approx(cpu.per_rollout_s, abs=0.011)  # a clock tick per thread family


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
