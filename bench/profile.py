"""``python -m bench.profile [--rollouts N] [--sdk docker|skypilot-emulator] [--out FILE]``: where one rollout's host CPU goes.

Runs the scale benchmark's ``cpu`` phase (a chat call plus the Osmosis grader at
concurrency 4, the server in a process of its own) with yappi profiling every thread of the
server on the CPU clock (cProfile would see only the event loop's thread, not the SDK's
executor or ``to_thread`` work), then prints the CPU per rollout, the top functions by own
time and the own time summed per area (osmosis server, Harbor, our backend, SDK, ...).
Needs ``pip install yappi`` (a profiling aid, not a dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .emulator_path import SANDBOX_IMAGE
from .emulator_server import EMULATOR, start_emulator
from .env import workdir
from .scale import cpu_phase

AREAS: tuple[tuple[str, str], ...] = (
    ("osmosis_harbor/sandbox/docker", "our Docker SDK"),
    ("osmosis_harbor/sandbox/emulator", "skypilot-emulator client"),
    ("osmosis_harbor/sandbox", "sandbox environment (ours)"),
    ("osmosis_harbor/backend", "backend: plan, attempts, outcome"),
    ("osmosis_harbor/tasks", "tasks: resolve, materialize"),
    ("osmosis_harbor/key_custody", "key custody and scrub"),
    ("osmosis_harbor/agents", "workflow agent"),
    ("osmosis_harbor/trials", "reading trials"),
    ("osmosis_harbor", "osmosis_harbor, other"),
    ("harbor/", "Harbor: trial, verifier, models"),
    ("osmosis_ai", "osmosis server"),
    ("docker/", "docker-py"),
    ("requests", "requests/urllib3"),
    ("urllib3", "requests/urllib3"),
    ("pydantic", "pydantic"),
    ("uvicorn", "uvicorn/starlette/fastapi"),
    ("starlette", "uvicorn/starlette/fastapi"),
    ("fastapi", "uvicorn/starlette/fastapi"),
    ("httpx", "httpx/httpcore"),
    ("httpcore", "httpx/httpcore"),
    ("logging", "logging"),
    ("tarfile", "tar"),
    ("json", "json"),
    ("asyncio", "asyncio"),
    ("threading", "threads"),
    ("concurrent", "threads"),
)


def area(filename: str) -> str:
    for needle, name in AREAS:
        if needle in filename:
            return name
    return "other (stdlib, libs)"


# The categories, each an entry point's inclusive time (Harbor's and ours) or a
# library's own time: they overlap where an entry point calls a library (e.g. Harbor's trial
# creation calls pathlib and tomllib), so they are read as shares, not summed.
CUMULATIVE: tuple[tuple[str, str, str], ...] = (
    ("Harbor Trial.create: task load and parse, trial lock content hash", "harbor/trial/trial.py", "create"),
    ("Harbor result init: Task.checksum", "harbor/models/task/task.py", "Task.checksum"),
    ("Harbor separate verifier: env definition, artifacts, uploads", "harbor/trial/trial.py", "_run_separate_verifier"),
    ("  Harbor TaskFileFilter.is_excluded (inside the above)", "harbor/models/task/file_filter.py", "is_excluded"),
    ("  Harbor compute_content_hash (inside the above)", "harbor/publisher/packager.py", "compute_content_hash"),
    ("our plan and materialize (Planner.trial_config)", "osmosis_harbor/backend/plan.py", "trial_config"),
    ("our outcome and trial reading (build_outcome)", "osmosis_harbor/backend/outcome.py", "build_outcome"),
)
OWN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("key custody and scrub", ("osmosis_harbor/key_custody.py",)),
    ("tar (tarfile, our extraction)", ("tarfile.py", "osmosis_harbor/sandbox/extract")),
    ("JSON", ("/json/",)),
    ("Docker SDK client (requests, urllib3, docker-py)", ("requests/", "urllib3/", "site-packages/docker/")),
    ("emulator SDK client (httpx, httpcore, our client)", ("httpx/", "httpcore/", "osmosis_harbor/sandbox/emulator")),
    ("osmosis server (osmosis_ai, uvicorn, starlette)", ("osmosis_ai/", "uvicorn/", "starlette/", "fastapi/")),
    ("logging", ("logging/",)),
    ("asyncio", ("asyncio/",)),
)


def by_concern(stats: pstats.Stats, rollouts: int) -> None:
    """Where the time goes, in the issue's categories (ms per rollout and share of the profile)."""
    table = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in table.values()) or 1.0
    rows: list[tuple[str, float]] = []
    for name, needle, func in CUMULATIVE:
        rows.append((name, sum(v[3] for (f, _, fn), v in table.items() if needle in f and fn.endswith(func))))
    for name, needles in OWN:
        rows.append((name, sum(v[2] for (f, _, _), v in table.items() if any(n in f for n in needles))))
    print("by concern (inclusive for entry points, own time for libraries):")
    for name, seconds in rows:
        print(f"  {seconds / rollouts * 1000:7.1f} ms/rollout  {100 * seconds / total:5.1f} %  {name}")


def summarize(stats: pstats.Stats, rollouts: int, top: int) -> None:
    own: dict[str, float] = defaultdict(float)
    table = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, _, tottime, _, _) in table.items():
        own[area(filename)] += tottime
    total = sum(own.values())
    print(f"profiled CPU {total:.3f} s over {rollouts} rollouts: {total / rollouts * 1000:.1f} ms per rollout")
    for name, seconds in sorted(own.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds / rollouts * 1000:7.1f} ms/rollout  {100 * seconds / total:5.1f} %  {name}")
    by_concern(stats, rollouts)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


async def main_async(rollouts: int, out: Path, sdk: str = "docker") -> None:
    work = workdir("profile")
    chat = FakeChatServer(default_reply="true")
    # On the emulator, a server of the run's own, removed with everything it made afterwards
    # (an on-demand one would outlive the run under the temporary HOME nobody reuses).
    emulator = None
    if sdk == EMULATOR:
        emulator = await asyncio.to_thread(start_emulator, SANDBOX_IMAGE, 0.0, 0.0, 0.0)
    try:
        per_rollout = (await cpu_phase(work, chat, rollouts, profile_to=out, sdk=sdk)).per_rollout_s
    finally:
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
        if emulator is not None:
            for problem in await asyncio.to_thread(emulator.close):
                print(f"left behind by the emulator run: {problem}")
    print(
        f"server CPU per graded rollout while profiled (utime + stime; the profiler inflates it): {per_rollout:.3f} s"
    )
    summarize(pstats.Stats(str(out)), rollouts, 40)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=12)
    parser.add_argument("--sdk", default="docker", choices=("docker", "skypilot-emulator"))
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.gettempdir()) / f"osmosis-profile-{os.getpid()}.pstat"
    )
    args = parser.parse_args(argv)
    home = tempfile.mkdtemp(prefix="osmosis-bench-home-")
    os.environ["HOME"] = home  # the osmosis server writes trajectories under ~/.osmosis
    try:
        asyncio.run(main_async(args.rollouts, args.out, args.sdk))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
