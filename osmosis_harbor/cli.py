"""Command line: ``python -m osmosis_harbor validate | bundle | sandbox-check | ...``.

Each subcommand lives in its own function; user errors print one line on stderr and exit
with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from .dataset import DatasetError, check_task, discover_tasks, is_task_dir, select_tasks
from .lint import LintMode
from .sandbox.sdk import SDK_NAMES, SandboxSdkMissingError

EXIT_USAGE = 2


class UserError(Exception):
    """A problem with the user's input; printed as one line."""


def _environment(args: argparse.Namespace, *, reach_host: bool = False):
    """The sandbox environment a command's --env/--registry/--pool/... options describe.

    ``reach_host``: the sandbox must reach servers on this machine (a local policy
    endpoint), which local Docker sandboxes do with host networking."""
    from .sandbox import environment_config

    pool = getattr(args, "pool", None)
    return environment_config(
        args.env,
        registry=getattr(args, "registry", None),
        pool=pool,
        pool_size=(args.pool_size or 1) if pool and hasattr(args, "pool_size") else None,
        force_build=getattr(args, "force_build", False),
        host_network=reach_host and args.env == "docker",
    )


def _add_env_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", choices=SDK_NAMES, default="docker",
                        help="sandbox SDK: local Docker engine (default) or SkyPilot")
    parser.add_argument("--registry", help="push task images to this registry (e.g. 127.0.0.1:5000)")
    parser.add_argument("--pool", help="claim sandboxes from this warm pool")


def _console() -> Console:
    """Wide enough for the result tables even when stdout is not a terminal (CI logs):
    160 columns, or ``$COLUMNS`` when set."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=int(os.environ.get("COLUMNS") or 160))
    return console


def cmd_validate(args: argparse.Namespace) -> int:
    from .junit import write_junit
    from .report import ValidationProgress, kept_trials_note, validation_table
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
                lint=LintMode(args.lint),
            )
        )
    console.print(validation_table(report))
    if report.job_dir:
        console.print(kept_trials_note(report.job_dir))
    if args.json:
        Path(args.json).write_text(report.model_dump_json(indent=2) + "\n")
    if args.junit:
        write_junit(report, Path(args.junit), suite_name=args.path)
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


def _agent_args(args: argparse.Namespace) -> dict:
    """Backend keywords for --workflow/--agent/--grader/--code-dir."""
    if args.workflow and args.agent:
        raise UserError("pass either --workflow (an AgentWorkflow) or --agent (a native Harbor agent), not both")
    return {
        "agent": args.workflow or args.agent or "oracle",
        "workflow_config": args.workflow_config,
        "grader": args.grader,
        "grader_config": args.grader_config,
        "code_dir": Path(args.code_dir) if args.code_dir else None,
        "bundles_dir": Path(args.bundles_dir) if args.bundles_dir else None,
    }


def _add_agent_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workflow", metavar="MOD:CLS", help="the AgentWorkflow to bundle and run")
    parser.add_argument("--workflow-config", metavar="MOD:OBJ", help="its module-level config object")
    parser.add_argument("--agent", help="a native Harbor agent instead: oracle, terminus-2, mini-swe-agent")
    parser.add_argument("--grader", metavar="MOD:CLS", help="an Osmosis Grader (else the task's own tests)")
    parser.add_argument("--grader-config", metavar="MOD:OBJ")
    parser.add_argument("--code-dir", help="the workflow project (pyproject.toml + one package)")
    parser.add_argument("--bundles-dir", help="bundle cache (default ./bundles)")


def cmd_prewarm(args: argparse.Namespace) -> int:
    from harbor.trial.queue import TrialQueue

    from .backend import HarborBackend
    from .native import NotTrainableWarning
    from .prewarm import PrewarmError
    from .report import PrewarmProgress, prewarm_table

    path = Path(args.path)
    mode = args.mode or ("template" if is_task_dir(path) else "dataset")
    if args.pool_size is not None and not args.pool:
        raise UserError("--pool-size needs --pool NAME")
    with warnings.catch_warnings():
        if not (args.workflow or args.agent):  # images and pools only: the oracle default is implicit
            warnings.simplefilter("ignore", NotTrainableWarning)
            logging.getLogger("osmosis_harbor.native").setLevel(logging.ERROR)
        backend = HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1), tasks_dir=path, task_mode=mode,
            environment_config=_environment(args, reach_host=True), **_agent_args(args),
        )
    task_ids = args.task or backend.resolver.task_ids()
    select_tasks(discover_tasks(path), task_ids if mode == "dataset" else None)  # unknown ids: one line
    progress = PrewarmProgress(Console(stderr=True))
    try:
        with progress.live():
            report = asyncio.run(backend.prewarm(task_ids, on_progress=progress.update))
    except PrewarmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _console().print(prewarm_table(report))
    if args.json:
        Path(args.json).write_text(report.model_dump_json(indent=2) + "\n")
    return 0 if report.failed == 0 else 1


def cmd_rollout(args: argparse.Namespace) -> int:
    import os

    from harbor.trial.queue import TrialQueue
    from rich.panel import Panel

    from .backend import HarborBackend
    from .local_run import run_one_rollout, trajectories_home
    from .scripted_policy import FakeChatServer

    if bool(args.chat_url) == bool(args.scripted_reply):
        raise UserError("pass either --chat-url URL (a real policy endpoint) or --scripted-reply TEXT")
    path = Path(args.path)
    mode = "template" if is_task_dir(path) else "dataset"
    if mode == "dataset" and not args.task_id:
        raise UserError(f"{path} is a dataset: pass --task-id ID")
    home = trajectories_home()
    scripted = FakeChatServer(default_reply=args.scripted_reply) if args.scripted_reply else None
    try:
        env = _environment(args, reach_host=True)
        backend = HarborBackend(orchestrator=TrialQueue(n_concurrent=1), tasks_dir=path, task_mode=mode,
                                environment_config=env, **_agent_args(args))
        result = asyncio.run(run_one_rollout(
            backend=backend, prompt=args.prompt,
            chat_completions_url=scripted.base_url if scripted else args.chat_url,
            api_key=os.environ.get(args.api_key_env) if args.api_key_env else "local-demo-key",
            label=args.label, metadata={"harbor_task_id": args.task_id} if args.task_id else None,
            grade=not args.no_grade,
        ))
    finally:
        if scripted:
            scripted.close()
        home.cleanup()
    console = _console()
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        body = f"status: {result.status}\nreward: {result.sample.reward if result.sample else None}"
        if result.err_message:
            body += f"\nerror ({result.err_category}): {result.err_message}"
        if result.sample is not None:
            body += f"\nmetrics: {result.sample.metrics}"
            for message in result.sample.messages:
                body += f"\n[{message.get('role')}] {str(message.get('content'))[:300]}"
        from rich.markup import escape

        console.print(Panel(escape(body), title="rollout result"))
    return 0 if str(result.status) == "success" else 1


def cmd_cleanup(args: argparse.Namespace) -> int:
    """Remove what the local Docker sandboxes left: expired or orphaned sandboxes, and the
    warm pools a prewarm created (pools outlive the prewarm command by design)."""
    from rich.table import Table

    from .sandbox import docker_sdk

    removed = [(r.name, r.reason) for r in docker_sdk.reap(expired=True, dead_owners=True)]
    for pool in docker_sdk.list_pools():
        if args.all_pools or any(pool.name.startswith(prefix) for prefix in args.pool or []):
            removed += [(r.name, f"pool {pool.name} deleted") for r in docker_sdk.delete_pool(pool.name)]
            removed.append((pool.name, "pool spec deleted"))
    table = Table(title="Removed")
    table.add_column("name")
    table.add_column("why")
    for name, why in removed:
        table.add_row(name, str(why))
    _console().print(table if removed else "nothing to remove")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_harbor",
        description="Osmosis rollouts as Harbor trials in SkyPilot (or local Docker) sandboxes.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Harbor's logs")
    sub = parser.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="oracle-validate a Harbor dataset or task")
    v.add_argument("path", help="a dataset (tasks found at any depth) or a single task directory")
    v.add_argument("--agent", choices=("oracle", "nop"), default="oracle",
                   help="oracle: solutions must score 1 (default); nop: untouched sandboxes must score 0")
    _add_env_args(v)
    v.add_argument("-n", "--n-concurrent", type=int, default=4, help="trials in parallel (default 4)")
    v.add_argument("--json", metavar="FILE", help="also write a machine-readable report")
    v.add_argument("--task", action="append", metavar="ID", help="only these task ids (repeatable)")
    v.add_argument("--force-build", action="store_true",
                   help="build from environment/Dockerfile even when task.toml names a docker_image")
    v.add_argument("--trials-dir", help="keep the trials here, as a Harbor job directory "
                                        "(default: a temp dir, removed)")
    v.add_argument("--keep-trials", action="store_true",
                   help="keep the trials (a Harbor job directory that `harbor view` browses)")
    v.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report (one test case per task)")
    # "--lint" is a flag and "--lint=strict" its strict form (main() spells the latter
    # "--lint-strict" for argparse), so "validate --lint PATH" never eats PATH.
    v.add_argument("--lint", dest="lint", action="store_const", const="report", default="off",
                   help="run Harbor's lint rules on each task first and show findings; "
                        "--lint=strict also refuses tasks with lint errors")
    v.add_argument("--lint-strict", dest="lint", action="store_const", const="strict", help=argparse.SUPPRESS)
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser("prewarm", help="build/push task images, prove agent setup, size warm pools")
    p.add_argument("path", help="a template task or a dataset of tasks")
    p.add_argument("--mode", choices=("template", "dataset"), help="default: template for a task dir")
    _add_agent_args(p)
    p.add_argument("--env", choices=SDK_NAMES, default="docker")
    p.add_argument("--registry", help="push images to this registry (e.g. 127.0.0.1:5000)")
    p.add_argument("--pool", metavar="NAME", help="create/resize a warm pool per environment group")
    p.add_argument("--pool-size", type=int, metavar="N", help="running sandboxes per pool (default 1)")
    p.add_argument("--task", action="append", metavar="ID", help="only these task ids (dataset mode)")
    p.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    p.set_defaults(func=cmd_prewarm)

    r = sub.add_parser("rollout", help="run one rollout locally through the real osmosis server")
    r.add_argument("path", help="the template task (or a dataset, with --task-id)")
    _add_agent_args(r)
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

    g = sub.add_parser("cleanup", help="remove expired/orphaned local sandboxes and prewarmed pools")
    g.add_argument("--pool", action="append", metavar="PREFIX", help="delete pools whose name starts so")
    g.add_argument("--all-pools", action="store_true", help="delete every local warm pool")
    g.set_defaults(func=cmd_cleanup)

    c = sub.add_parser("sandbox-check", help="run the sky.sandbox conformance suite against an SDK")
    c.add_argument("--sdk", choices=SDK_NAMES, default="docker")
    c.add_argument("--image", default="debian:trixie-slim")
    c.add_argument("--no-pools", action="store_true", help="skip the warm-pool checks")
    c.add_argument("--json", metavar="FILE")
    c.set_defaults(func=cmd_sandbox_check)

    # Listed for --help only: main() hands "bundle ..." to the bundler's own parser.
    sub.add_parser("bundle", help="build a workflow bundle wheel", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bundle":
        from .bundle import cli_main as bundle_main

        return _guard(lambda: bundle_main(argv[1:]))
    argv = ["--lint-strict" if arg == "--lint=strict" else arg for arg in argv]
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    # Harbor pins its logger at DEBUG; its per-trial chatter belongs in the trial logs, and
    # what matters to the user of this command is in the result table.
    logging.getLogger("harbor.utils.logger").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    if getattr(args, "n_concurrent", 1) < 1:
        print("error: -n must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    return _guard(lambda: args.func(args), verbose=args.verbose)


def _guard(run, *, verbose: bool = False) -> int:
    try:
        return run()
    except (DatasetError, UserError, SandboxSdkMissingError, ValueError) as exc:
        if verbose:  # -v: the whole story, for bug reports
            raise
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted: trials cancelled, sandboxes terminated", file=sys.stderr)
        return 130
