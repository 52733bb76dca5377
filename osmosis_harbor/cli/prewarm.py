"""``prewarm PATH``: build or reuse images, prove the agent setup, size warm pools."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from osmosis_harbor.cli.common import agent_args, environment_for, result_console
from osmosis_harbor.errors import UserError
from osmosis_harbor.tasks.discovery import discover_tasks, is_task_dir, select_tasks

if TYPE_CHECKING:
    from osmosis_harbor.prewarm import PrewarmReport


def cmd_prewarm(args: argparse.Namespace) -> int:
    from harbor.trial.queue import TrialQueue

    from osmosis_harbor.agents.native import NotTrainableWarning
    from osmosis_harbor.backend import HarborBackend
    from osmosis_harbor.cli.report import PrewarmProgress
    from osmosis_harbor.prewarm import PrewarmError

    path = Path(args.path)
    mode = args.mode or ("template" if is_task_dir(path) else "dataset")
    if args.pool_size is not None and not args.pool:
        raise UserError("--pool-size needs --pool NAME")
    with warnings.catch_warnings():
        if not (args.workflow or args.agent):  # images and pools only: the oracle default is implicit
            warnings.simplefilter("ignore", NotTrainableWarning)
            logging.getLogger("osmosis_harbor.agents.native").setLevel(logging.ERROR)
        backend = HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=path,
            task_mode=mode,
            environment_config=environment_for(args),
            **agent_args(args),
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
    backend.owner.sandboxes.release_pools()  # the pools outlive this command by design
    return print_report(report, args)


def print_report(report: PrewarmReport, args: argparse.Namespace) -> int:
    """The groups' table, the leak audit's findings when there are any, ``--json``; the exit
    status (1 when a task failed: its findings alone never fail a prewarm)."""
    from osmosis_harbor.cli.report import audit_table, prewarm_table

    console = result_console(args.settings)
    console.print(prewarm_table(report))
    leaks = audit_table([f for g in report.groups_detail if g.audit is not None for f in g.audit.findings])
    if leaks is not None:
        console.print(leaks)
    if args.json:
        Path(args.json).write_text(report.model_dump_json(indent=2) + "\n")
    return 0 if report.failed == 0 else 1
