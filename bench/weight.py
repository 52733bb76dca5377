"""Weight that must earn its place: each optional speed path with and without, in the same run.

Why: a speed patch, a second transport or a second route is code to keep working across Harbor
and docker-py releases; it stays only while it shows a gain on the default path. Each case below
switches one of them by its own setting (or, for one group of Harbor fast paths, by leaving that
group out after they are installed) and measures both sides alternately, round after round, so
both see the same machine. The table shows every side's median, its range over the rounds and the
ratio without / with; a gain counts only when every round without is slower than every round with
(the ranges do not overlap), which on a shared machine is the least a gain must show.

* ``graded``: the rollout server's CPU per graded rollout (the server in a process of its own,
  ``bench.server_proc``; 8 graded rollouts at concurrency 4 after two warm-ups, per round) with the
  defaults, and with one switch flipped each: Harbor's fast paths off
  (``OSMOSIS_HARBOR_HARBOR_FASTPATHS=0``), only the artifact copy's left out, docker-py's own
  transport (``OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT=0``), and the Docker SDK's archive calls
  (``OSMOSIS_HARBOR_SDK_ARCHIVE_CALLS=1``, off by default). Also each batch's wall time.
* ``floor``: Harbor's own ``Trial`` on a null environment (``bench.harbor_floor``) without our fast
  paths, with all, and with all but one group (the task checks, the trial lock's ``task.toml``
  facts), each in a fresh process: finer than the rollout, where a few milliseconds drown.
* ``warm``: sequential graded rollouts, submit to result, alternating between a backend whose
  baked images start a warm interpreter and one whose do not, on ``docker`` (no pool: its default
  is off) and, with ``--env skypilot-emulator``, on the emulator (its default is on).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_harbor.harbor_compat import fastpaths
from osmosis_harbor.serving.local import serve_locally
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from . import harbor_floor
from .common import BenchResult, Figure
from .env import dispose, grader_task, make_backend, workdir
from .server_proc import ServerProcess, ServerSpec, make_ours
from .soak import controller
from .workload import GRADED_PROMPT, submit_rollout

NAME = "weight"
TITLE = "each optional speed path with vs without, alternating rounds in one run"
CONCURRENCY = 4

ARTIFACT_COPY = ("harbor.trial.artifact_handler:copy_via_tar",)
LOCK_FACTS = (
    "harbor.models.job.lock:_task_package_version",
    "harbor.models.job.lock:_task_verifier_environment_mode",
)
TASK_CHECKS = tuple(f.label for f in fastpaths.FASTPATHS if f.label not in ARTIFACT_COPY + LOCK_FACTS)


def make_without_artifact_copy(spec: ServerSpec) -> Any:
    """Our backend with Harbor's fast paths installed but its own ``copy_via_tar`` put back."""
    backend = make_ours(spec)
    fastpaths.uninstall(ARTIFACT_COPY)
    return backend


@dataclass(frozen=True)
class Variant:
    """One side of a case: its label, the variables the server process starts with, its backend."""

    key: str
    label: str
    variables: dict[str, str] = field(default_factory=dict)
    make: Callable[[ServerSpec], Any] = make_ours


DEFAULTS = Variant("defaults", "defaults (every switch as shipped)")
GRADED_VARIANTS: tuple[Variant, ...] = (
    DEFAULTS,
    Variant("no_fastpaths", "Harbor's fast paths off", {"OSMOSIS_HARBOR_HARBOR_FASTPATHS": "0"}),
    Variant("no_artifact_copy", "Harbor's own artifact copy (other fast paths on)", make=make_without_artifact_copy),
    Variant("no_lean_http", "docker-py's transport", {"OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT": "0"}),
    Variant("sdk_archive_calls", "the Docker SDK's archive calls", {"OSMOSIS_HARBOR_SDK_ARCHIVE_CALLS": "1"}),
)


@contextmanager
def variables(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment for the block (a spawned server inherits them)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous


async def graded_round(work: Path, chat: FakeChatServer, variant: Variant, rollouts: int) -> tuple[float, float]:
    """One server process of ``variant``: (its CPU per graded rollout, the batch's wall seconds)."""
    spec = ServerSpec(
        Path(tempfile.mkdtemp(prefix=f"{variant.key}-", dir=work)),
        n_concurrent=CONCURRENCY,
        graded=True,
        make=variant.make,
    )
    with variables(variant.variables):
        server = ServerProcess(spec)
        await server.__aenter__()
    try:
        async with controller(server.url, rollouts + 2) as client:
            for _ in range(2):
                await submit_rollout(client, chat.base_url, GRADED_PROMPT, grade=True, timeout=None)
            before, started = server.cpu_sec(), time.perf_counter()
            oks = await asyncio.gather(
                *(
                    submit_rollout(client, chat.base_url, GRADED_PROMPT, grade=True, timeout=None)
                    for _ in range(rollouts)
                )
            )
            spent, wall = server.cpu_sec() - before, time.perf_counter() - started
    finally:
        await server.close()
    if not all(oks):
        raise RuntimeError(f"{variant.label}: {oks.count(False)} of {rollouts} graded rollouts failed")
    return spent / rollouts, wall


def judge(result: BenchResult, name: str, without: Figure, with_: Figure) -> str:
    """Ratio without / with, the ranges, and whether the gain is clear of the noise: every sample
    without above every sample with."""
    ratio = result.ratio(name, without, with_, f"without {_span(without)} vs with {_span(with_)}")
    clear = min(without.samples) > max(with_.samples)
    verdict = "gains (ranges apart)" if clear else "no clear gain (ranges overlap)"
    result.info[f"{name}: verdict"] = f"{ratio.value:.3f}x, {verdict}"
    return verdict


def _span(figure: Figure) -> str:
    return f"{min(figure.samples):.3f}-{max(figure.samples):.3f}" if figure.samples else "-"


async def graded_case(result: BenchResult, work: Path, rounds: int, rollouts: int) -> None:
    chat = FakeChatServer(default_reply="true")
    cpu: dict[str, list[float]] = {v.key: [] for v in GRADED_VARIANTS}
    wall: dict[str, list[float]] = {v.key: [] for v in GRADED_VARIANTS}
    try:
        for index in range(rounds):
            shift = index % len(GRADED_VARIANTS)  # each round starts with another side
            for variant in GRADED_VARIANTS[shift:] + GRADED_VARIANTS[:shift]:
                seconds, batch = await graded_round(work, chat, variant, rollouts)
                cpu[variant.key].append(seconds)
                wall[variant.key].append(batch)
    finally:
        chat.close()
    note = f"{rollouts} graded rollouts at concurrency {CONCURRENCY} per round"
    figures = {
        v.key: result.add(f"server CPU per graded rollout: {v.label}", "s", cpu[v.key], note, baseline=v is DEFAULTS)
        for v in GRADED_VARIANTS
    }
    walls = {
        v.key: result.add(f"batch wall time: {v.label}", "s", wall[v.key], baseline=v is DEFAULTS)
        for v in GRADED_VARIANTS
    }
    base = figures[DEFAULTS.key]
    judge(result, "Harbor's fast paths: CPU off / on", figures["no_fastpaths"], base)
    judge(result, "artifact copy: CPU Harbor's / ours", figures["no_artifact_copy"], base)
    judge(result, "lean engine client: CPU docker-py / ours", figures["no_lean_http"], base)
    judge(result, "SDK archive calls: CPU defaults / archive calls", base, figures["sdk_archive_calls"])
    judge(result, "SDK archive calls: wall defaults / archive calls", walls[DEFAULTS.key], walls["sdk_archive_calls"])
    for key in cpu:
        result.headline_value(f"graded_cpu_{key}_s", figures[key].median)


async def floor_case(result: BenchResult, rounds: int, trials: int) -> None:
    sides: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
        ("as shipped", False, ()),
        ("all our fast paths", True, ()),
        ("all but the task checks", True, TASK_CHECKS),
        ("all but the lock facts", True, LOCK_FACTS),
    )
    samples: dict[str, list[float]] = {label: [] for label, _, _ in sides}
    for index in range(rounds):
        shift = index % len(sides)
        for label, on, without in sides[shift:] + sides[:shift]:
            figures = await asyncio.to_thread(harbor_floor.measure, trials, fastpaths=on, without=without)
            samples[label].append(float(figures["cpu_per_trial_s"]))
    note = f"{trials} oracle trials at concurrency {harbor_floor.CONCURRENCY}, no sandbox"
    made = {
        label: result.add(f"Harbor's Trial, null environment: {label}", "s", s, note) for label, s in samples.items()
    }
    ours = made["all our fast paths"]
    judge(result, "Harbor floor: as shipped / all fast paths", made["as shipped"], ours)
    judge(result, "Harbor floor: without the task checks / all", made["all but the task checks"], ours)
    judge(result, "Harbor floor: without the lock facts / all", made["all but the lock facts"], ours)


async def warm_case(result: BenchResult, work: Path, sdk: str, rollouts: int) -> None:
    """Sequential graded rollouts alternating between warm interpreters on and off on ``sdk``."""
    chat = FakeChatServer(default_reply="true")
    backends = {
        warm: make_backend(
            work / f"warm-{sdk}-{warm}",
            grader="AnswerGrader",
            sdk=sdk,
            tasks_dir=grader_task(work / f"warm-{sdk}-{warm}"),
            warm_interpreters=warm,
        )
        for warm in (True, False)
    }
    seconds: dict[bool, list[float]] = {True: [], False: []}
    try:
        for backend in backends.values():
            await backend.prewarm()
        async with serve_locally(backends[True]) as warm_url, serve_locally(backends[False]) as cold_url:
            async with controller(warm_url, rollouts + 1) as warm_client, controller(cold_url, rollouts + 1) as cold:
                clients = {True: warm_client, False: cold}
                for warm in (True, False):  # a warm-up each (image build, bundle)
                    await submit_rollout(clients[warm], chat.base_url, GRADED_PROMPT, grade=True, timeout=None)
                for index in range(2 * rollouts):
                    warm = index % 2 == 0
                    started = time.perf_counter()
                    ok = await submit_rollout(clients[warm], chat.base_url, GRADED_PROMPT, grade=True, timeout=None)
                    seconds[warm].append(time.perf_counter() - started)
                    if not ok:
                        result.warn(f"a graded rollout on {sdk} (warm={warm}) did not succeed")
    finally:
        for backend in backends.values():
            await dispose(backend)
        chat.close()
    on = result.add(f"{sdk}, no pool: submit to result, warm interpreters on", "s", seconds[True])
    off = result.add(f"{sdk}, no pool: submit to result, warm interpreters off", "s", seconds[False])
    judge(result, f"warm interpreters on {sdk}: off / on", off, on)


async def run(quick: bool, *, smallest: bool = False, envs: tuple[str, ...] = ("docker",)) -> BenchResult:
    rounds, rollouts, trials, sequential = (1, 1, 2, 1) if smallest else (3, 8, 40, 4) if quick else (5, 8, 100, 6)
    result = BenchResult(NAME, TITLE)
    result.info["rounds"] = rounds
    work = workdir(NAME)
    try:
        await floor_case(result, rounds, trials)
        await graded_case(result, work, rounds, rollouts)
        await warm_case(result, work, "docker", sequential)
        if "skypilot-emulator" in envs:
            from .emulator_path import SANDBOX_IMAGE
            from .emulator_server import EMULATOR, start_emulator

            emulator = await asyncio.to_thread(start_emulator, SANDBOX_IMAGE, 0, 0, 0)
            try:
                await warm_case(result, work, EMULATOR, sequential)
            finally:
                for problem in await asyncio.to_thread(emulator.close):
                    result.warn(problem)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.notes.append(
        "a gain counts only when every round without is slower than every round with; ratio without / with"
    )
    return result
