"""Command line: ``python -m osmosis_harbor validate | bundle | sandbox-check | ...``.

Each subcommand lives in its own function; user errors print one line on stderr and exit
with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from .dataset import DatasetError, check_task, discover_tasks, is_task_dir, select_tasks
from .sandbox.sdk import SDK_NAMES, SandboxSdkMissingError

EXIT_USAGE = 2


class UserError(Exception):
    """A problem with the user's input; printed as one line."""


def _environment(args: argparse.Namespace):
    from .sandbox import environment_config

    return environment_config(
        args.env,
        registry=getattr(args, "registry", None),
        pool=getattr(args, "pool", None),
        force_build=getattr(args, "force_build", False),
    )


def _add_env_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", choices=SDK_NAMES, default="docker",
                        help="sandbox SDK: local Docker engine (default) or SkyPilot")
    parser.add_argument("--registry", help="push task images to this registry (e.g. 127.0.0.1:5000)")
    parser.add_argument("--pool", help="claim sandboxes from this warm pool")


def _console() -> Console:
    """Wide enough for the result tables even when stdout is not a terminal (CI logs)."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    return console


def cmd_validate(args: argparse.Namespace) -> int:
    from .report import ValidationProgress, validation_table
    from .validate import validate_tasks

    path = Path(args.path)
    tasks = select_tasks(discover_tasks(path), args.task)
    if is_task_dir(path):
        check_task(tasks[0])  # a single task: bad input is a one-line error
    environment = _environment(args)
    console = _console()
    progress = ValidationProgress(Console(stderr=True), [t.id for t in tasks])
    with progress.live():
        report = asyncio.run(
            validate_tasks(
                tasks,
                environment=environment,
                agent=args.agent,
                n_concurrent=args.n_concurrent,
                trials_dir=Path(args.trials_dir) if args.trials_dir else None,
                keep_trials=args.keep_trials or bool(args.trials_dir),
                on_progress=progress.update,
            )
        )
    console.print(validation_table(report))
    if args.json:
        Path(args.json).write_text(report.model_dump_json(indent=2) + "\n")
    return 0 if report.ok else 1


def cmd_sandbox_check(args: argparse.Namespace) -> int:
    from rich.table import Table

    from .sandbox import load_sandbox_sdk
    from .sandbox.conformance import run_conformance

    sdk = load_sandbox_sdk(args.sdk)
    results = asyncio.run(run_conformance(sdk, args.image, include_pools=not args.no_pools))
    table = Table(title=f"sky.sandbox conformance ({args.sdk}, image {args.image})")
    for col in ("check", "result", "seconds", "detail"):
        table.add_column(col)
    for r in results:
        table.add_row(r.name, "[green]pass[/]" if r.passed else "[red]FAIL[/]", f"{r.seconds:.2f}", r.detail or "")
    _console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps([r.model_dump() for r in results], indent=2) + "\n")
    return 0 if all(r.passed for r in results) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m osmosis_harbor", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show Harbor's logs")
    sub = parser.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="oracle-validate a Harbor dataset or task")
    v.add_argument("path", help="a dataset (tasks found at any depth) or a single task directory")
    v.add_argument("--agent", default="oracle", help="Harbor agent to run (default: oracle)")
    _add_env_args(v)
    v.add_argument("-n", "--n-concurrent", type=int, default=4, help="trials in parallel (default 4)")
    v.add_argument("--json", metavar="FILE", help="also write a machine-readable report")
    v.add_argument("--task", action="append", metavar="ID", help="only these task ids (repeatable)")
    v.add_argument("--force-build", action="store_true",
                   help="build from environment/Dockerfile even when task.toml names a docker_image")
    v.add_argument("--trials-dir", help="keep trial directories here (default: a temp dir, removed)")
    v.add_argument("--keep-trials", action="store_true", help="keep the trial directories")
    v.set_defaults(func=cmd_validate)

    c = sub.add_parser("sandbox-check", help="run the sky.sandbox conformance suite against an SDK")
    c.add_argument("--sdk", choices=SDK_NAMES, default="docker")
    c.add_argument("--image", default="debian:trixie-slim")
    c.add_argument("--no-pools", action="store_true", help="skip the warm-pool checks")
    c.add_argument("--json", metavar="FILE")
    c.set_defaults(func=cmd_sandbox_check)

    try:
        from .bundle import cli_main as bundle_main  # noqa: F401
    except ImportError:
        pass
    else:
        b = sub.add_parser("bundle", help="build a workflow bundle wheel", add_help=False)
        b.set_defaults(func=None, passthrough=bundle_main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bundle":
        from .bundle import cli_main as bundle_main

        return _guard(lambda: bundle_main(argv[1:]))
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    # Harbor pins its logger at DEBUG; its per-trial chatter belongs in the trial logs, and
    # what matters to the user of this command is in the result table.
    logging.getLogger("harbor.utils.logger").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    if getattr(args, "n_concurrent", 1) < 1:
        print("error: -n must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    return _guard(lambda: args.func(args))


def _guard(run) -> int:
    try:
        return run()
    except (DatasetError, UserError, SandboxSdkMissingError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted: trials cancelled, sandboxes terminated", file=sys.stderr)
        return 130
