"""``validate PATH``: oracle (or nop) validation of a dataset in sandboxes."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from harbor.models.trial.config import EnvironmentConfig
from rich.console import Console

from osmosis_harbor.cli.common import environment_for, result_console
from osmosis_harbor.tasks.discovery import (
    TaskRef,
    check_task,
    discover_tasks,
    is_task_dir,
    select_tasks,
)
from osmosis_harbor.validate.lint import LintMode


def cmd_validate(args: argparse.Namespace) -> int:
    from osmosis_harbor.cli.report import ValidationProgress, audit_table, kept_trials_note, lint_table
    from osmosis_harbor.cli.validation_report import ValidationView
    from osmosis_harbor.validate import validate_tasks
    from osmosis_harbor.validate.json_report import report_json
    from osmosis_harbor.validate.junit import write_junit

    path = Path(args.path)
    tasks = select_tasks(discover_tasks(path), args.task)
    if is_task_dir(path):
        check_task(tasks[0])  # a single task: bad input is a one-line error
    environment = environment_for(args)
    console = result_console(args.settings)
    if args.audit:
        return _audit_only(args, tasks, environment, console)
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
    leaks = audit_table([f for row in report.tasks for f in row.audit or []])
    if leaks is not None:
        console.print(leaks)
    if report.job_dir:
        console.print(kept_trials_note(report.job_dir))
    if args.json:
        Path(args.json).write_text(report_json(report), encoding="utf-8")
    if args.junit:
        write_junit(report, Path(args.junit), suite_name=args.path)
    return 0 if report.ok else 1


def _audit_only(
    args: argparse.Namespace, tasks: list[TaskRef], environment: EnvironmentConfig, console: Console
) -> int:
    """``validate --audit``: the leak audit alone; 1 when it found an error."""
    from osmosis_harbor.cli.report import ValidationProgress, audit_table
    from osmosis_harbor.trials.printable import json_safe
    from osmosis_harbor.validate.audit import audit_dataset

    progress = ValidationProgress(Console(stderr=True), [t.id for t in tasks])
    with progress.live():
        report = asyncio.run(
            audit_dataset(
                tasks,
                environment=environment,
                config=args.settings,
                n_concurrent=args.n_concurrent,
                on_progress=progress.update,
            )
        )
    table = audit_table(report.findings)
    console.print(table if table is not None else "leak audit: no findings")
    errors, warnings = len(report.errors), len(report.findings) - len(report.errors)
    console.print(
        f"leak audit: {len(tasks)} task(s), {len(report.environments)} environment(s), "
        f"{errors} error(s), {warnings} warning(s)"
    )
    if args.json:
        data = json_safe(report.model_dump(mode="json"))
        Path(args.json).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 1 if errors else 0
