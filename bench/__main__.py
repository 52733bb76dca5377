"""``python -m bench [--quick] [--env docker|skypilot-emulator ...] [--only NAME ...] [--latency-ms MS] [--scale-n N] [--soak-n N]``: run the benchmarks.

``--env docker`` (the default) runs the Docker benchmarks; ``--env skypilot-emulator`` runs the
SkyPilot path on a skypilot-emulator server the run starts (``bench.emulator_path``: its floor
beside Docker's, calls without archives, warm pool against cold create at ``--cold-create-sec`` /
``--pool-claim-sec``); ``--only scale`` also runs ``workers`` (``bench.workers``: the server with
``--workers N`` worker processes against one); both ``--env`` flags run both in one run, with one targets table. ``soak`` exists on both
paths: on the emulator it is ``soak-emulator`` (``bench.soak_emulator``: API faults and
evictions), selected by ``--only soak`` (or its own name) with ``--env skypilot-emulator``.

Each benchmark prints a table (medians, p90, its same-run baseline and the ratio) and the
whole run is written to JSON after every benchmark, so a crash keeps what was measured.
The run ends with the targets table (``bench.targets``) for what it measured. ``--only incumbent``
(never run by default) puts osmosis-ai 0.3.8's own Harbor backend beside ours (``bench.incumbent``).
The scale, workers, incumbent, emulator and emulator-soak figures are also written at the top
level of the JSON (``"scale"``, ``"workers"``, ``"incumbent"``, ``"emulator"``, ``"soak_emulator"``).
HOME points at a temporary directory for the run (the osmosis server saves trajectories
under ``~/.osmosis``). After each benchmark the engine is checked for anything this
process still owns; leftovers are reported as a WARNING line and removed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import inspect
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from . import targets
from .common import BenchResult, console, render
from .latency import DEFAULT_LATENCY_MS

BENCHMARKS: tuple[str, ...] = (
    "overhead",
    "throughput",
    "bundle",
    "prewarm",
    "admission",
    "soak",
    "transfer",
    "scale",
    "workers",
    "weight",
)
# Run only when named with --only: the incumbent needs uv (its harbor extra's pin) beside this
# interpreter and builds an image of its own.
OPT_IN_BENCHMARKS: tuple[str, ...] = ("incumbent",)
EMULATOR_BENCHMARKS: tuple[str, ...] = ("emulator", "soak-emulator")
# Benchmarks a name selects on the emulator path besides itself: ``--only soak`` runs both soaks.
EMULATOR_TWINS = {"soak": "soak-emulator"}
# Benchmarks a name selects on the Docker path besides itself: ``--only scale`` measures the
# workers too (``bench.workers``: one server process against N).
DOCKER_TWINS = {"scale": "workers"}
ON_REQUEST: tuple[str, ...] = ("soak-emulator",)  # long: run only when named in --only
ENVS: tuple[str, ...] = ("docker", "skypilot-emulator")
MODULES = {
    "bundle": "bench.bundle_build",
    "emulator": "bench.emulator_path",
    "soak-emulator": "bench.soak_emulator",
}  # ``bench.bundle`` would read like the product's module
# Headline figures also written at the top level, under these keys.
TOP_LEVEL: dict[str, str] = {
    "scale": "scale",
    "incumbent": "incumbent",
    "soak-emulator": "soak_emulator",
    "workers": "workers",  # front_cpu_per_rollout_s, completions_per_s keyed by worker count, ...
    "emulator": "emulator",  # sdk_calls_graded, sdk_calls_trivial, sdk_sec_graded_at_80ms among its figures
}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes and fewer repeats (overhead + throughput: about 3 minutes)"
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        default=[],
        help=f"run only these (repeatable or comma-separated): {', '.join(BENCHMARKS + OPT_IN_BENCHMARKS)}",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=DEFAULT_LATENCY_MS,
        metavar="MS",
        help="simulated round trip added to every sandbox SDK call in the latency runs of overhead and "
        f"throughput (default {DEFAULT_LATENCY_MS:g}; 0 skips them)",
    )
    parser.add_argument(
        "--env",
        action="append",
        choices=ENVS,
        default=[],
        help="sandbox path(s) to benchmark, repeatable (default docker); skypilot-emulator starts its own server",
    )
    parser.add_argument(
        "--cold-create-sec",
        type=float,
        default=2.0,
        metavar="S",
        help="the emulator's cold-create time for the skypilot-emulator run (default 2)",
    )
    parser.add_argument(
        "--pool-claim-sec",
        type=float,
        default=0.3,
        metavar="S",
        help="the emulator's pool-claim time for the skypilot-emulator run (default 0.3)",
    )
    parser.add_argument("--smallest", action="store_true", help=argparse.SUPPRESS)  # tests: one of each
    parser.add_argument(
        "--scale-n",
        type=int,
        default=None,
        metavar="N",
        help="rollouts held in flight at once by the scale benchmark (default 300; 24 with --quick) and by "
        "workers' in-flight phase (default 1,000; 24 with --quick)",
    )
    parser.add_argument(
        "--soak-n",
        type=int,
        default=None,
        metavar="N",
        help="rollouts of the soak (default 200 on docker, 500 on skypilot-emulator; 50 with --quick)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        metavar="N",
        help="worker processes the workers benchmark sets against one (default 2; it also measures 1 and 2)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default: {DEFAULT_OUT})")
    parser.add_argument(
        "--keep-images",
        action="store_true",
        help="keep task images the run had to build for the template task (faster reruns)",
    )
    args = parser.parse_args(argv)
    if args.scale_n is not None and args.scale_n < 1:
        parser.error(f"--scale-n must be 1 or more, got {args.scale_n}")
    if args.workers < 2:
        parser.error(f"--workers must be 2 or more, got {args.workers}")
    if args.soak_n is not None and args.soak_n < 2:
        parser.error(f"--soak-n must be 2 or more, got {args.soak_n}")
    if args.latency_ms < 0:
        parser.error(f"--latency-ms must be 0 or more, got {args.latency_ms:g}")
    if args.cold_create_sec < 0 or args.pool_claim_sec < 0:
        parser.error("--cold-create-sec and --pool-claim-sec must be 0 or more")
    envs = args.env or ["docker"]
    default = (BENCHMARKS if "docker" in envs else ()) + (EMULATOR_BENCHMARKS if "skypilot-emulator" in envs else ())
    available = default + (OPT_IN_BENCHMARKS if "docker" in envs else ())
    selected = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    if "skypilot-emulator" in envs:
        selected += [EMULATOR_TWINS[n] for n in selected if n in EMULATOR_TWINS]
    if "docker" in envs:
        selected += [DOCKER_TWINS[n] for n in selected if n in DOCKER_TWINS]
    unknown = [n for n in selected if n not in available and not (n in EMULATOR_TWINS and "docker" not in envs)]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)} for --env {' '.join(envs)}; choose from {', '.join(available)}"
        )
    args.selected = [n for n in available if n in selected] if selected else [n for n in default if n not in ON_REQUEST]
    return args


def load(name: str, args: argparse.Namespace) -> Callable[[bool], Awaitable[BenchResult]]:
    """The benchmark's ``run(quick)``, given the options it takes (latency, scale N, emulator create times)."""
    run = importlib.import_module(MODULES.get(name, f"bench.{name}")).run
    parameters = inspect.signature(run).parameters
    names = ("latency_ms", "scale_n", "soak_n", "cold_create_sec", "pool_claim_sec", "smallest", "workers")
    options = {k: getattr(args, k) for k in names}
    return functools.partial(run, **{k: v for k, v in options.items() if k in parameters})


def hygiene(result: BenchResult) -> None:
    """Report (as a WARNING) and remove anything this process still owns on the engine."""
    from .env import cleanup_process, leftovers

    try:
        left = leftovers()
    except Exception as exc:
        result.warn(f"could not check for leftovers: {exc}")
        return
    result.info["leftovers after benchmark"] = len(left)
    if left:
        result.warn(f"left behind (now removed): {', '.join(left)}")
        cleanup_process()


def write(out: Path, payload: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(out)


async def run_all(args: argparse.Namespace) -> int:

    from .env import BUILT_IMAGES, note_builds, remove_images

    note_builds()

    payload: dict[str, Any] = {
        "meta": {
            "quick": args.quick,
            "selected": args.selected,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "latency_ms": args.latency_ms,
            "env": args.env or ["docker"],
            "cold_create_sec": args.cold_create_sec,
            "pool_claim_sec": args.pool_claim_sec,
        },
        "benchmarks": {},
    }
    started = time.perf_counter()
    status = 0
    try:
        for name in args.selected:
            console.rule(f"[bold]{name}[/]" + (" (quick)" if args.quick else ""))
            t0 = time.perf_counter()
            try:
                result = await load(name, args)(args.quick)
            except Exception as exc:
                traceback.print_exc()
                result = BenchResult(name, "failed", error=f"{type(exc).__name__}: {exc}")
                status = 1
            result.wall_sec = time.perf_counter() - t0
            hygiene(result)
            render(result)
            payload["benchmarks"][name] = result.to_json()
            if name in TOP_LEVEL and result.headline:  # the headline figures, at the top level
                payload[TOP_LEVEL[name]] = dict(result.headline)
            payload["meta"]["wall_sec"] = round(time.perf_counter() - started, 3)
            write(args.out, payload)
    finally:
        built = list(dict.fromkeys(BUILT_IMAGES))
        payload["meta"]["images_built"] = built
        if built and not args.keep_images:
            failed = remove_images(built)
            console.print(f"removed {len(built) - len(failed)} image(s) this run built for the template task")
            for problem in failed:
                console.print(f"[bold yellow]WARNING[/] image not removed: {problem}")
    payload["meta"]["wall_sec"] = round(time.perf_counter() - started, 3)
    rows = targets.evaluate(payload["benchmarks"], args.latency_ms)
    if rows:
        console.rule("[bold]targets[/]")
        targets.render(rows)
        payload["targets"] = rows
    write(args.out, payload)
    console.rule()
    console.print(f"total wall time {payload['meta']['wall_sec']:.1f} s; results in {args.out}")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    home = tempfile.mkdtemp(prefix="osmosis-bench-home-")
    saved_home = os.environ.get("HOME")
    os.environ["HOME"] = home  # the osmosis server writes trajectories under ~/.osmosis
    try:
        return asyncio.run(run_all(args))
    finally:
        if saved_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved_home
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
