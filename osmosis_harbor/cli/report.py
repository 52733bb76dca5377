"""Rich rendering for the command line: live progress while trials run, the lint and prewarm
tables (``validation_report`` has validate's results). Task ids and lint messages come from a
dataset, so they are shown through ``printable``."""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from osmosis_harbor.audit import AuditFinding, AuditSeverity
from osmosis_harbor.prewarm import PrewarmReport
from osmosis_harbor.trials.printable import printable
from osmosis_harbor.validate import ValidationReport
from osmosis_harbor.validate.lint import LintSeverity


def _shown(text: str, *, newlines: bool = False) -> str:
    """Dataset- or sandbox-made ``text`` as markup-free, control-free console text (one line
    unless ``newlines``)."""
    return escape(printable(text, newlines=newlines))


class ValidationProgress:
    """A live display: one overall bar plus the current stage of every running task."""

    def __init__(self, console: Console, task_ids: Sequence[str]) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._overall = self._progress.add_task("validating", total=len(task_ids))
        self._rows = {tid: self._progress.add_task(f"  {_shown(tid)}: waiting", total=None) for tid in task_ids}

    def update(self, task_id: str, stage: str) -> None:
        row = self._rows.get(task_id)
        if row is None:
            return
        finished = stage in {"passed", "failed", "invalid"}
        self._progress.update(row, description=f"  {_shown(task_id)}: {stage}", visible=not finished)
        if finished:
            self._progress.advance(self._overall)

    @contextmanager
    def live(self) -> Iterator[ValidationProgress]:
        with self._progress:
            yield self


def lint_table(report: ValidationReport) -> Table | None:
    """Every lint finding, one row each, apart from the results (None when there are none).

    A rule that fires on many tasks is one row listing them, so a dataset-wide finding such as
    ``shared-verifier`` costs one line, not one per task."""
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for row in report.tasks:
        for issue in row.lint or []:
            where = issue.path + (f":{issue.line}" if issue.line else "")
            grouped.setdefault((issue.severity, issue.rule, where, issue.message), []).append(row.id)
    if not grouped:
        return None
    table = Table(title="Lint (harbor lint rules)")
    for column in ("severity", "rule", "where", "tasks", "message"):
        table.add_column(column, overflow="fold")
    ordered = sorted(grouped.items(), key=lambda item: (item[0][0] != LintSeverity.ERROR, item[0][1], item[0][2]))
    for (severity, rule, where, message), ids in ordered:
        style = "red" if severity == LintSeverity.ERROR else "yellow"
        shown = ", ".join(ids[:3]) + (f" (+{len(ids) - 3})" if len(ids) > 3 else "")
        table.add_row(Text(str(severity), style), rule, _shown(where), _shown(shown), _shown(message))
    return table


def audit_table(findings: Sequence[AuditFinding]) -> Table | None:
    """The leak audit's findings, errors first, one row each (None when there are none)."""
    if not findings:
        return None
    table = Table(title="Leak audit (answers within the agent's reach)")
    for column in ("severity", "kind", "task", "path", "evidence", "read with", "advice"):
        table.add_column(column, overflow="fold")
    ordered = sorted(findings, key=lambda f: (f.severity != AuditSeverity.ERROR, f.task_id, f.kind, f.path))
    for f in ordered:
        style = "red" if f.severity == AuditSeverity.ERROR else "yellow"
        evidence = f"{f.ref}: {f.evidence}" if f.ref else f.evidence
        table.add_row(
            Text(str(f.severity), style),
            str(f.kind),
            _shown(f.task_id),
            _shown(f.path),
            _shown(evidence),
            _shown(f.read_with or "-"),
            _shown(f.advice),
        )
    return table


def kept_trials_note(job_dir: str) -> Text:
    """Where the kept trials are, and the command that browses them."""
    return Text(f"trials kept in {job_dir} (a Harbor job: harbor view {shlex.quote(str(Path(job_dir).parent))})")


class PrewarmProgress:
    """One row per environment group, showing its current stage (image, setup, pool)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
        )
        self._rows: dict[str, TaskID] = {}

    def update(self, group: str, stage: str) -> None:
        label = {
            "image": "building/pushing image",
            "setup": "agent setup",
            "pool": "sizing pool",
            "done": "done",
            "failed": "FAILED",
        }.get(stage, stage)
        if group not in self._rows:
            self._rows[group] = self._progress.add_task(f"environment {group}: {label}", total=None)
        else:
            self._progress.update(self._rows[group], description=f"environment {group}: {label}")

    @contextmanager
    def live(self) -> Iterator[PrewarmProgress]:
        with self._progress:
            yield self


def prewarm_table(report: PrewarmReport) -> Table:
    table = Table(title="Prewarm")
    for column in ("environment", "tasks", "image", "image status", "setup", "pool", "time", "error"):
        table.add_column(column, overflow="fold")
    for group in report.groups_detail:
        ids = ", ".join(group.task_ids[:3]) + (f" (+{len(group.task_ids) - 3})" if len(group.task_ids) > 3 else "")
        status = "built" if group.built else "reused" if group.reused else "-"
        table.add_row(
            group.key,
            f"{len(group.task_ids)}: {_shown(ids)}",
            group.image or "-",
            status,
            "[green]ok[/]" if group.setup_ok else "[red]failed[/]" if group.error else "-",
            f"{group.pool} x{group.pool_size}" if group.pool else "cold (note below)" if group.pool_note else "-",
            f"{sum(group.timings_sec.values()):.1f}s",
            _shown(group.error or "", newlines=True),
        )
    table.caption = (
        f"{report.groups} environment group(s), {report.tasks} task(s): {report.built} built, "
        f"{report.reused} reused, {report.failed} task(s) failed, in {report.wall_sec:.1f}s"
    )
    for group in report.groups_detail:  # a group no warm pool can serve: its tasks run cold, not failed
        if group.pool is None and group.pool_note:
            table.caption += f"\nnote: {group.key}: {_shown(group.pool_note)}"
    return table
