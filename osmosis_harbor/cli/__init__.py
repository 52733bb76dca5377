"""Command line: ``python -m osmosis_harbor validate | prewarm | rollout | bundle | sandbox-check | cleanup |
base-images | emulator | seccomp-profile``.

One module per command; user errors (``OsmosisHarborError``) print one line on stderr and exit
with status 2. Anything else is a bug: it shows its traceback (under ``-v`` in full). A command's
module is imported only when that command runs, with its machinery (the backend, Harbor's queue,
an SDK): ``--help``, a mistyped command and the light commands (``cleanup``, ``emulator``,
``base-images``) import neither Harbor nor osmosis_ai's rollout package, and start in a third of
the CPU time.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from osmosis_harbor import settings
from osmosis_harbor.cli.base_images import add_base_images_parser
from osmosis_harbor.cli.common import EXIT_USAGE, add_agent_args, add_env_args, pool_size_arg
from osmosis_harbor.cli.emulator import add_emulator_parser
from osmosis_harbor.cli.seccomp import add_seccomp_parser
from osmosis_harbor.errors import OsmosisHarborError
from osmosis_harbor.sandbox.sdk.registry import SDK_NAMES
from osmosis_harbor.settings import use_bundled_model_prices
from osmosis_harbor.trials.printable import printable

__all__ = ["EXIT_USAGE", "PrintableFormatter", "build_parser", "main", "run_guarded"]


# Each command's module is imported when that command runs: validate's alone imports Harbor's
# models and the leak audit (~0.3 CPU-s), which --help, cleanup or a mistyped command never need.
# build_parser reads these names when it builds, so a test can stand in for a command.


def quiet_harbor_logs(verbose: bool) -> None:
    """Harbor pins its logger at DEBUG when its logger module is first imported; its per-trial
    chatter belongs in the trial logs, and what matters to the user of a command is in the result
    table. So the commands that run Harbor import that module first, then set the level."""
    import harbor.utils.logger

    harbor.utils.logger.logger.setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def _deferred(module: str, name: str, *, runs_harbor: bool = True) -> Callable[[argparse.Namespace], int]:
    """The handler that imports ``osmosis_harbor.cli.<module>`` when its command runs and hands
    the arguments to that module's ``name``, after quieting Harbor's logger where it runs Harbor."""

    def handler(args: argparse.Namespace) -> int:
        if runs_harbor:
            quiet_harbor_logs(args.verbose)
        run: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(f"osmosis_harbor.cli.{module}"), name
        )
        return run(args)

    handler.__name__ = handler.__qualname__ = name
    return handler


cmd_validate = _deferred("validate", "cmd_validate")
cmd_prewarm = _deferred("prewarm", "cmd_prewarm")
cmd_rollout = _deferred("rollout", "cmd_rollout")
cmd_cleanup = _deferred("sandbox", "cmd_cleanup", runs_harbor=False)
cmd_sandbox_check = _deferred("sandbox", "cmd_sandbox_check")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_harbor",
        description="Osmosis rollouts as Harbor trials in SkyPilot (or local Docker) sandboxes.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show Harbor's logs")
    sub = parser.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="oracle-validate a Harbor dataset or task")
    v.add_argument("path", help="a dataset (tasks found at any depth) or a single task directory")
    v.add_argument(
        "--agent",
        choices=("oracle", "nop"),
        default="oracle",
        help="oracle: solutions must score 1 (default); nop: untouched sandboxes must score 0",
    )
    add_env_args(v)
    v.add_argument("-n", "--n-concurrent", type=int, default=4, help="trials in parallel (default 4)")
    v.add_argument("--json", metavar="FILE", help="also write a machine-readable report")
    v.add_argument("--task", action="append", metavar="ID", help="only these task ids (repeatable)")
    v.add_argument(
        "--force-build",
        action="store_true",
        help="build from environment/Dockerfile even when task.toml names a docker_image",
    )
    v.add_argument(
        "--trials-dir", help="keep the trials here, as a Harbor job directory (default: a temp dir, removed)"
    )
    v.add_argument(
        "--keep-trials", action="store_true", help="keep the trials (a Harbor job directory that `harbor view` browses)"
    )
    v.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report (one test case per task)")
    # "--lint" is a flag and "--lint=strict" its strict form (main() spells the latter
    # "--lint-strict" for argparse), so "validate --lint PATH" never eats PATH.
    v.add_argument(
        "--lint",
        dest="lint",
        action="store_const",
        const="report",
        default="off",
        help="run Harbor's lint rules on each task first and show findings; "
        "--lint=strict also refuses tasks with lint errors",
    )
    v.add_argument("--lint-strict", dest="lint", action="store_const", const="strict", help=argparse.SUPPRESS)
    v.add_argument(
        "--audit",
        action="store_true",
        help="only the leak audit (git history beyond HEAD, copies of tests/ or solution/ in the image), "
        "no trials; exits 1 on an audit error (--lint runs it before the trials too)",
    )
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser("prewarm", help="build/push task images, prove agent setup, size warm pools")
    p.add_argument("path", help="a template task or a dataset of tasks")
    p.add_argument("--mode", choices=("template", "dataset"), help="default: template for a task dir")
    add_agent_args(p)
    p.add_argument("--env", choices=SDK_NAMES, default="docker")
    p.add_argument("--registry", help="push images to this registry (e.g. 127.0.0.1:5000)")
    p.add_argument("--pool", metavar="NAME", help="create/resize a warm pool per environment group")
    p.add_argument(
        "--pool-size", type=pool_size_arg, metavar="N|auto", help="running sandboxes per pool (default 1), or auto"
    )
    p.add_argument("--task", action="append", metavar="ID", help="only these task ids (dataset mode)")
    p.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    p.set_defaults(func=cmd_prewarm)

    r = sub.add_parser("rollout", help="run one rollout locally through the real osmosis server")
    r.add_argument("path", help="the template task (or a dataset, with --task-id)")
    add_agent_args(r)
    r.add_argument("--prompt", required=True, help="the user message")
    r.add_argument("--label", help="the reference answer the grader sees")
    r.add_argument("--task-id", help="dataset mode: the task to run")
    r.add_argument("--chat-url", help="the policy's chat-completions base URL")
    r.add_argument("--api-key-env", help="environment variable holding the policy API key")
    r.add_argument("--scripted-reply", help="no policy? start a scripted endpoint that answers this")
    r.add_argument("--env", choices=SDK_NAMES, default="docker")
    r.add_argument("--no-grade", action="store_true")
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.set_defaults(func=cmd_rollout)

    g = sub.add_parser("cleanup", help="remove what dead owners left (ledger and SDK listing), and prewarmed pools")
    g.add_argument("--env", choices=SDK_NAMES, default="docker", help="the sandbox SDK to clean up")
    g.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    g.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    g.add_argument("--pool", action="append", metavar="PREFIX", help="delete pools whose name starts so")
    g.add_argument("--all-pools", action="store_true", help="delete every local warm pool")
    g.set_defaults(func=cmd_cleanup)

    c = sub.add_parser("sandbox-check", help="run the sky.sandbox conformance suite against an SDK")
    c.add_argument("--sdk", choices=SDK_NAMES, default="docker")
    c.add_argument("--image", default="debian:trixie-slim")
    c.add_argument("--no-pools", action="store_true", help="skip the warm-pool checks (reported as skipped)")
    c.add_argument("--strict", action="store_true", help="fail when any check was skipped, not only on failures")
    c.add_argument("--check", action="append", metavar="NAME", help="run only this check (repeatable)")
    c.add_argument("--json", metavar="FILE")
    c.set_defaults(func=cmd_sandbox_check)

    add_emulator_parser(sub)
    add_base_images_parser(sub)
    add_seccomp_parser(sub)

    # Listed for --help only: main() hands "bundle ..." to the bundler's own parser.
    sub.add_parser("bundle", help="build a workflow bundle wheel", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    use_bundled_model_prices()
    config = settings.current()  # read once for the command, carried on its arguments
    if words and words[0] == "bundle":
        from osmosis_harbor.cli.bundle import cli_main as bundle_main

        return run_guarded(lambda: bundle_main(words[1:], config))
    words = ["--lint-strict" if word == "--lint=strict" else word for word in words]
    args = build_parser().parse_args(words)
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter(logging.BASIC_FORMAT))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[handler])
    args.settings = config
    if getattr(args, "n_concurrent", 1) < 1:
        print("error: -n must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    return run_guarded(lambda: args.func(args), verbose=args.verbose)


class PrintableFormatter(logging.Formatter):
    """Log lines quote sandbox-made names and output: their control characters are escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def run_guarded(run: Callable[[], int], *, verbose: bool = False) -> int:
    """Our own errors are one line (the whole story under ``-v``); anything else is a bug and
    keeps its traceback."""
    try:
        return run()
    except OsmosisHarborError as exc:
        if verbose:  # -v: the whole story, for bug reports
            raise
        print(f"error: {printable(str(exc))}", file=sys.stderr)  # it may quote a dataset-made name
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted: trials cancelled, sandboxes terminated", file=sys.stderr)
        return 130
