"""``validate PATH``: oracle (or nop) validation of a dataset in sandboxes."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from rich.console import Console

from osmosis_harbor.cli.common import environment_for, result_console
from osmosis_harbor.tasks.discovery import (
    check_task,
    discover_tasks,
    is_task_dir,
    select_tasks,
)
from osmosis_harbor.validate.lint import LintMode


def cmd_validate(args: argparse.Namespace) -> int:
    from osmosis_harbor.cli.report import ValidationProgress, kept_trials_note, lint_table
    from osmosis_harbor.cli.validation_report import ValidationView
    from osmosis_harbor.validate import validate_tasks
    from osmosis_harbor.validate.json_report import report_json
    from osmosis_harbor.validate.junit import write_junit

    path = Path(args.path)
    tasks = select_tasks(discover_tasks(path), args.task)
    if is_task_dir(path):
        check_task(tasks[0])  # a single task: bad input is a one-line error
    environment = environment_for(args)
    console = result_console()
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
    console.print(ValidationView(report))
    findings = lint_table(report)
    if findings is not None:
        console.print(findings)
    if report.job_dir:
        console.print(kept_trials_note(report.job_dir))
    if args.json:
        Path(args.json).write_text(report_json(report), encoding="utf-8")
    if args.junit:
        write_junit(report, Path(args.junit), suite_name=args.path)
    return 0 if report.ok else 1
