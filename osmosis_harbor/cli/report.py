"""Rich rendering for the command line: live progress while trials run, result tables."""

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

from osmosis_harbor.prewarm import PrewarmReport
from osmosis_harbor.validate import TaskValidation, ValidationReport
from osmosis_harbor.validate.lint import LintSeverity

_TIMING_ORDER = ("environment", "agent_setup", "agent", "verifier", "total")


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
        self._rows = {tid: self._progress.add_task(f"  {tid}: waiting", total=None) for tid in task_ids}

    def update(self, task_id: str, stage: str) -> None:
        row = self._rows.get(task_id)
        if row is None:
            return
        finished = stage in {"passed", "failed", "invalid"}
        self._progress.update(row, description=f"  {task_id}: {stage}", visible=not finished)
        if finished:
            self._progress.advance(self._overall)

    @contextmanager
    def live(self) -> Iterator[ValidationProgress]:
        with self._progress:
            yield self


def _timings_text(row: TaskValidation) -> str:
    parts = [f"{k} {row.timings_sec[k]:.1f}s" for k in _TIMING_ORDER if k in row.timings_sec]
    return ", ".join(parts) or "-"


def _rewards_text(row: TaskValidation) -> str:
    """The primary reward alone when that is all there is, else every channel."""
    if not row.rewards:
        return "-" if row.reward is None else f"{row.reward:g}"
    if set(row.rewards) == {"reward"}:
        return f"{row.rewards['reward']:g}"
    return " ".join(f"{key}={value:g}" for key, value in sorted(row.rewards.items()))


def _steps_text(row: TaskValidation) -> str:
    if row.steps is None:
        return ""
    marks = []
    for step in row.steps:
        mark = (
            "[green]ok[/]"
            if step.passed and step.ran
            else "skipped"
            if not step.ran and step.passed
            else "[red]FAIL[/]"
        )
        marks.append(f"{escape(step.name)} {mark}")
    return ", ".join(marks)


def _lint_counts(row: TaskValidation) -> str:
    """``2E 3W``: a task's lint findings by severity, for one compact column."""
    issues = row.lint or []
    errors = sum(1 for i in issues if i.severity is LintSeverity.ERROR)
    warnings = len(issues) - errors
    parts = ([f"[red]{errors}E[/]"] if errors else []) + ([f"[yellow]{warnings}W[/]"] if warnings else [])
    return " ".join(parts) or "-"


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
        table.add_row(Text(str(severity), style), rule, escape(where), escape(shown), escape(message))
    return table


def kept_trials_note(job_dir: str) -> Text:
    """Where the kept trials are, and the command that browses them."""
    return Text(f"trials kept in {job_dir} (a Harbor job: harbor view {shlex.quote(str(Path(job_dir).parent))})")


def validation_table(report: ValidationReport) -> Table:
    goal = "solutions must score 1" if report.agent == "oracle" else "untouched sandboxes must score 0"
    table = Table(title=f"Validation ({report.agent} agent: {goal}; {report.environment} sandboxes)")
    table.add_column("task", style="bold")
    table.add_column("result")
    table.add_column("reward", justify="right", overflow="fold")
    with_steps = any(row.steps is not None for row in report.tasks)
    if with_steps:
        table.add_column("steps", overflow="fold")
    table.add_column("failed phase")
    with_lint = any(row.lint is not None for row in report.tasks)
    if with_lint:
        table.add_column("lint")  # counts; the findings are in lint_table
    table.add_column("error", overflow="fold", max_width=60)
    table.add_column("timings", overflow="fold")
    for row in report.tasks:
        cells = [escape(row.id), "[green]pass[/]" if row.passed else "[red]FAIL[/]", _rewards_text(row)]
        if with_steps:
            cells.append(_steps_text(row))
        cells.append(row.failed_phase or "")
        if with_lint:
            cells.append(_lint_counts(row))
        cells += [escape(row.error or ""), _timings_text(row)]
        table.add_row(*cells)
    table.caption = f"{report.passed} passed, {report.failed} failed in {report.wall_sec:.1f}s"
    return table


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
            f"{len(group.task_ids)}: {ids}",
            group.image or "-",
            status,
            "[green]ok[/]" if group.setup_ok else "[red]failed[/]" if group.error else "-",
            f"{group.pool} x{group.pool_size}" if group.pool else "-",
            f"{sum(group.timings_sec.values()):.1f}s",
            group.error or "",
        )
    table.caption = (
        f"{report.groups} environment group(s), {report.tasks} task(s): {report.built} built, "
        f"{report.reused} reused, {report.failed} task(s) failed, in {report.wall_sec:.1f}s"
    )
    return table
