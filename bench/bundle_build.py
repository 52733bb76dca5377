"""Bundle build: a cold build (empty cache) against a cache hit.

Why: ``HarborBackend`` builds the workflow bundle in its constructor, so a server start
pays for it; the content-addressed cache is what keeps restarts (and every test and CLI
call after the first) cheap. The cache hit is the baseline: cold / hit says how much the
cache saves, and the hit's absolute time is the fixed cost every start keeps paying
(project walk + content hash + wheel inspection).

How: ``osmosis_harbor.bundle.build`` on the fixture project with ``ListWorkflow`` and its
config; cold = a fresh cache directory each repeat, hit = the same call again on a
filled cache. ``BuildResult.cached`` is checked so a cold run that hit (or a hit that
built) is reported as a MISMATCH instead of silently skewing the figures.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import osmosis_harbor.bundle.builder as bundle_module
from osmosis_harbor.bundle import build

from .common import BenchResult, stopwatch
from .env import PROJECT, WF, workdir

NAME = "bundle"
TITLE = "bundle wheel build: cold (fresh cache) vs cache hit"


@dataclass(frozen=True)
class Sizes:
    cold: int
    hits: int


def sizes(quick: bool) -> Sizes:
    return Sizes(cold=3, hits=10) if quick else Sizes(cold=7, hits=30)


@contextlib.contextmanager
def step_timers() -> Iterator[dict[str, list[float]]]:
    """Time the two subprocess-backed steps of a cold build (names looked up in bundle.py)."""
    spent: dict[str, list[float]] = defaultdict(list)
    saved = {name: getattr(bundle_module, name) for name in ("build_wheel", "verify_targets")}

    def timed(name: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return saved[name](*args, **kwargs)
            finally:
                spent[name].append(time.perf_counter() - started)

        return wrapper

    for name in saved:
        setattr(bundle_module, name, timed(name))
    try:
        yield spent
    finally:
        for name, fn in saved.items():
            setattr(bundle_module, name, fn)


async def run(quick: bool) -> BenchResult:
    size = sizes(quick)
    result = BenchResult(NAME, TITLE)
    work = workdir(NAME)
    kwargs = {"workflow": f"{WF}:ListWorkflow", "workflow_config": f"{WF}:fixture_config"}
    cold: list[float] = []
    cold_wall: list[float] = []
    hits: list[float] = []
    mismatches: list[str] = []
    steps: dict[str, list[float]] = defaultdict(list)
    try:
        warm_cache = work / "warm"
        build(PROJECT, cache_dir=warm_cache, **kwargs)  # imports and first-call costs, not measured
        for i in range(size.cold):
            cache = work / f"cold-{i}"
            with step_timers() as spent, stopwatch() as t:
                built = build(PROJECT, cache_dir=cache, **kwargs)
            for name, seconds in spent.items():
                steps[name].append(sum(seconds))
            if built.cached:
                mismatches.append(f"cold build {i} reported a cache hit")
            cold.append(built.seconds)
            cold_wall.append(t[0])
            result.info.setdefault("wheel size KiB", round(built.info.wheel.stat().st_size / 1024, 1))
            result.info.setdefault("built in an isolated env", built.isolated)
            shutil.rmtree(cache, ignore_errors=True)
        for i in range(size.hits):
            hit = build(PROJECT, cache_dir=warm_cache, **kwargs)
            if not hit.cached:
                mismatches.append(f"cache hit {i} rebuilt the wheel")
            hits.append(hit.seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    f_cold = result.add("cold build (fresh cache)", "s", cold, "BuildResult.seconds")
    result.add("  cold build, wall around the call", "s", cold_wall)
    result.add("  cold step: project wheel (PEP 517 backend subprocess)", "s", steps["build_wheel"])
    result.add("  cold step: verify targets (import check subprocess)", "s", steps["verify_targets"])
    result.add(
        "  cold step: rest (copy, hash, graft, write, publish)",
        "s",
        [c - a - b for c, a, b in zip(cold, steps["build_wheel"], steps["verify_targets"], strict=False)],
    )
    f_hit = result.add("cache hit", "s", hits, baseline=True)
    result.ratio("cold / cache hit", f_cold, f_hit)
    result.info["mismatches"] = len(mismatches)
    for mismatch in mismatches:
        result.warn(f"MISMATCH: {mismatch}")
    return result
