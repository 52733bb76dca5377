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
  (``OSMOSIS_HARBOR_HARBOR_FASTPATHS=0``), docker-py's own transport
  (``OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT=0``). Also each batch's wall time.
* ``floor``: Harbor's own ``Trial`` on a null environment (``bench.harbor_floor``) without our fast
  paths and with them, each in a fresh process: finer than the rollout, where a few milliseconds
  drown.
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

from osmosis_harbor.testing.scripted_policy import FakeChatServer

from . import harbor_floor
from .common import BenchResult, Figure
from .env import workdir
from .server_proc import ServerProcess, ServerSpec, make_ours
from .soak import controller
from .workload import GRADED_PROMPT, submit_rollout

NAME = "weight"
TITLE = "each optional speed path with vs without, alternating rounds in one run"
CONCURRENCY = 4


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
    Variant("no_lean_http", "docker-py's transport", {"OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT": "0"}),
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
    judge(result, "Harbor's fast paths: batch wall off / on", walls["no_fastpaths"], walls[DEFAULTS.key])
    judge(result, "lean engine client: CPU docker-py / ours", figures["no_lean_http"], base)
    for key in cpu:
        result.headline_value(f"graded_cpu_{key}_s", figures[key].median)


async def floor_case(result: BenchResult, rounds: int, trials: int) -> None:
    sides: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
        ("as shipped", False, ()),
        ("our fast paths", True, ()),
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
    judge(result, "Harbor floor: as shipped / our fast paths", made["as shipped"], made["our fast paths"])
    result.headline_value("harbor_floor_fastpaths_ratio", made["as shipped"].median / made["our fast paths"].median)


async def run(quick: bool, *, smallest: bool = False) -> BenchResult:
    rounds, rollouts, trials = (1, 1, 2) if smallest else (3, 8, 40) if quick else (5, 8, 100)
    result = BenchResult(NAME, TITLE)
    result.info["rounds"] = rounds
    work = workdir(NAME)
    try:
        await floor_case(result, rounds, trials)
        await graded_case(result, work, rounds, rollouts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.notes.append(
        "a gain counts only when every round without is slower than every round with; ratio without / with"
    )
    return result
