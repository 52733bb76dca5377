"""``validate``'s report on a terminal: one line per task, then each failure on its own.

The table is laid out for the width it gets: the fixed columns (result, reward, steps, verifier
mode, lint, time) take what their text needs, the task id comes first and is never cut (it wraps only
when the width cannot hold it beside a short summary), and a failure's summary gets one line,
shortened with an ellipsis. Below the table, each failed task has a block: its id whole, the
summary, the stand-in note, why the verifier ran where it did, then the output that explains it, bounded to about one screen.
The JSON and JUnit reports carry the whole error and the phase timings. Everything a dataset
or a sandbox made is shown through ``printable`` (escapes instead of control characters).
"""

from __future__ import annotations

from collections.abc import Iterator

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from osmosis_harbor.trials.printable import printable
from osmosis_harbor.validate import TaskValidation, ValidationReport
from osmosis_harbor.validate.lint import LintSeverity

__all__ = ["DETAIL_LINES", "ValidationView"]

DETAIL_LINES = 20  # terminal lines of a failure's block below its header: one screen with it
HEAD_ROWS = 3  # terminal lines a failure's summary, note or steps line may take
_MIN_SUMMARY = 10  # the summary column's least width
_SUMMARY_WANTED = 40  # ids wider than what leaves the summary this much wrap, unless they fit in...
_ID_COMFORT = 32  # ...this much (and leave _MIN_SUMMARY)
_MIN_ID = 12
_REWARD_MAX = 16  # several reward channels wrap beyond this (below 120 columns: one a line)
_WIDE = 120
_GAP = 3  # between two columns: padding, the box's blank divider, padding


def compact_seconds(seconds: float) -> str:
    """``8.4s``, ``2m05s``, ``1h02m``: a duration in at most six characters."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _rewards_text(row: TaskValidation) -> str:
    """The primary reward alone when that is all there is, else every channel."""
    if not row.rewards:
        return "-" if row.reward is None else f"{row.reward:g}"
    if set(row.rewards) == {"reward"}:
        return f"{row.rewards['reward']:g}"
    return " ".join(f"{printable(key, newlines=False)}={value:g}" for key, value in sorted(row.rewards.items()))


def _steps_text(row: TaskValidation) -> str:
    if row.steps is None:
        return ""
    return f"{sum(1 for step in row.steps if step.passed)}/{len(row.steps)}"


def _lint_text(row: TaskValidation) -> Text:
    """``2E 3W``: a task's lint findings by severity (the findings are in the lint table)."""
    issues = row.lint or []
    errors = sum(1 for issue in issues if issue.severity is LintSeverity.ERROR)
    warnings = len(issues) - errors
    text = Text()
    if errors:
        text.append(f"{errors}E", "red")
    if warnings:
        text.append(f"{' ' if errors else ''}{warnings}W", "yellow")
    return text if text.plain else Text("-")


def _summary(row: TaskValidation) -> str:
    """A failure in one line: its phase, then the first line of its error (a stand-in base is
    marked; its note is in the failure's block)."""
    first = (row.error or "failed").split("\n", 1)[0].removeprefix(f"task {row.id}: ")
    marker = " [stand-in base]" if row.stand_in else ""
    return printable(f"{row.failed_phase or 'unknown'}: {first}{marker}", newlines=False)


def _steps_marks(row: TaskValidation) -> str:
    marks = []
    for step in row.steps or []:
        mark = "ok" if step.passed and step.ran else "skipped" if step.passed else "FAIL"
        marks.append(f"{printable(step.name, newlines=False)} {mark}")
    return ", ".join(marks)


class ValidationView:
    """The results table and the failures below it, laid out at the console's width."""

    def __init__(self, report: ValidationReport) -> None:
        self.report = report

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        yield self.table(width)
        for row in self.report.tasks:  # a task a warm pool could not serve ran cold: said, not failed
            if row.pool_note:
                yield Text(printable(f"note: {row.id}: {row.pool_note}", newlines=False), overflow="fold")
        failed = [row for row in self.report.tasks if not row.passed]
        if failed:
            yield Text(f"\n{len(failed)} failure{'s' if len(failed) != 1 else ''}:", style="bold")
        for row in failed:
            yield from self.failure(row, _Measure(console, options.update_width(max(width - 2, 1))))

    def _columns(self) -> list[tuple[str, list[str | Text]]]:
        """The fixed columns between the id and the summary: header and cells."""
        rows = self.report.tasks
        columns: list[tuple[str, list[str | Text]]] = [
            ("result", [Text("pass", "green") if r.passed else Text("FAIL", "red") for r in rows]),
            ("reward", [_rewards_text(r) for r in rows]),
        ]
        if any(r.steps is not None for r in rows):
            columns.append(("steps", [_steps_text(r) for r in rows]))
        if any(r.verification is not None for r in rows):  # where the tests ran: fresh, shared, separate
            columns.append(("verifier", [r.verification["mode"] if r.verification else "-" for r in rows]))
        if any(r.lint is not None for r in rows):
            columns.append(("lint", [_lint_text(r) for r in rows]))
        columns.append(
            ("time", [compact_seconds(r.timings_sec["total"]) if "total" in r.timings_sec else "-" for r in rows])
        )
        return columns

    def table(self, width: int) -> Table:
        report = self.report
        goal = "solutions must score 1" if report.agent == "oracle" else "untouched sandboxes must score 0"
        table = Table(
            title=f"Validation ({report.agent} agent: {goal}; {report.environment} sandboxes)",
            caption=f"{report.passed} passed, {report.failed} failed in {compact_seconds(report.wall_sec)}",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
        )
        ids = [printable(r.id, newlines=False) for r in report.tasks]
        summaries = [_summary(r) if not r.passed else "" for r in report.tasks]
        fixed = self._columns()
        id_width, fixed_widths, summary_width = _layout(ids, summaries, fixed, width)
        table.add_column("task", style="bold", width=id_width, overflow="fold")
        for (header, _), fixed_width in zip(fixed, fixed_widths, strict=True):
            table.add_column(
                header, width=fixed_width, overflow="fold", justify="right" if header != "result" else "left"
            )
        if summary_width:
            table.add_column("why", width=summary_width, no_wrap=True, overflow="ellipsis")
        for index, task_id in enumerate(ids):
            cells: list[str | Text] = [Text(task_id, overflow="fold")]
            cells += [cells_of[index] for _, cells_of in fixed]
            if summary_width:
                cells.append(Text(summaries[index], no_wrap=True, overflow="ellipsis"))
            table.add_row(*cells)
        return table

    def failure(self, row: TaskValidation, measure: _Measure) -> Iterator[Text | Padding]:
        """One failed task: a header with its id whole, then at most ``DETAIL_LINES`` lines."""
        header = Text("FAIL ", style="bold red")
        header.append(printable(row.id, newlines=False), style="bold")
        header.append(f"  ({row.failed_phase or 'unknown'} phase)")
        header.overflow = "fold"
        yield Text("")
        yield header
        summary, _, rest = (row.error or "failed").partition("\n")
        head = [summary]
        if row.stand_in:
            head.append(f"note: {row.stand_in}")
        if row.steps is not None:
            head.append(f"steps: {_steps_marks(row)}")
        if row.verification is not None:
            head.append(f"verifier: {row.verification['reason']}")
        for line in _bounded(head, rest.split("\n") if rest else [], measure):
            yield Padding(Text(printable(line, newlines=False), overflow="fold"), (0, 0, 0, 2), expand=False)


def _layout(
    ids: list[str], summaries: list[str], fixed: list[tuple[str, list[str | Text]]], width: int
) -> tuple[int, list[int], int]:
    """Widths of the id column, the fixed columns and the summary column (0: none) at ``width``.

    The fixed columns take their widest cell, unless that would wrap an id or squeeze the
    summary: then several reward channels wrap (at most ``_REWARD_MAX`` wide, below ``_WIDE``
    columns one channel a line)."""
    natural = [max([len(header), *(cell_len(str(cell)) for cell in cells)]) for header, cells in fixed]
    wanted_summary = min(max((cell_len(s) for s in summaries), default=0), _SUMMARY_WANTED)
    gaps = _GAP * (len(fixed) + (1 if wanted_summary else 0))
    longest_id = max((cell_len(task_id) for task_id in ids), default=0)
    fixed_widths = natural
    if longest_id + sum(natural) + wanted_summary + gaps > width:
        fixed_widths = [_narrow_width(header, cells, wide=width >= _WIDE) for header, cells in fixed]
    room = width - sum(fixed_widths) - gaps
    if not wanted_summary:
        return _id_width(ids, room), fixed_widths, 0
    id_width = _id_width(ids, max(room - _SUMMARY_WANTED, min(_ID_COMFORT, room - _MIN_SUMMARY)))
    return id_width, fixed_widths, max(min(max(cell_len(s) for s in summaries), room - id_width), 1)


def _narrow_width(header: str, cells: list[str | Text], *, wide: bool) -> int:
    """A fixed column's width when space is short: rewards wrap channel by channel."""
    texts = [str(cell) for cell in cells]
    natural = max([len(header), *(cell_len(text) for text in texts)])
    if header != "reward":
        return natural
    if wide:
        return min(natural, _REWARD_MAX)
    return max([len(header), *(cell_len(word) for text in texts for word in text.split())])


def _id_width(ids: list[str], most: int) -> int:
    """The id column's width: the longest id when every id fits in ``most``, else ``most`` (the
    longer ids wrap, in as few lines as that allows)."""
    longest = max(cell_len(task_id) for task_id in ids) if ids else 0
    return max(min(longest, most), len("task"), min(_MIN_ID, most))


class _Measure:
    """How many terminal lines a line of a failure's block takes, as the console folds it."""

    def __init__(self, console: Console, options: ConsoleOptions) -> None:
        self.console, self.options = console, options

    def rows(self, line: str) -> int:
        text = Text(printable(line, newlines=False), overflow="fold")
        return max(1, len(self.console.render_lines(text, self.options, pad=False)))

    def capped(self, line: str, rows: int = HEAD_ROWS) -> str:
        """``line`` cut to ``rows`` terminal lines, with an ellipsis (the reports have it whole)."""
        shown = printable(line, newlines=False)
        limit = rows * self.options.max_width
        return shown if cell_len(shown) <= limit else shown[: limit - 1] + "…"


def _bounded(head: list[str], tail: list[str], measure: _Measure) -> list[str]:
    """``head`` (each line at most ``HEAD_ROWS`` terminal lines), then as much of the end of
    ``tail`` as fits in ``DETAIL_LINES`` terminal lines, with a line saying how many were left out."""
    head = [measure.capped(line) for line in head]
    budget = DETAIL_LINES - sum(measure.rows(line) for line in head)
    costs = [measure.rows(line) for line in tail]
    if sum(costs) <= budget:
        return head + tail
    budget -= 1  # the line saying what was left out
    kept = 0
    while kept < len(tail) and costs[-1 - kept] <= budget:
        budget -= costs[-1 - kept]
        kept += 1
    left_out = len(tail) - kept
    note = f"[{left_out} earlier line{'s' if left_out != 1 else ''} left out: --json and --junit have them]"
    return [*head, note, *tail[len(tail) - kept :]]
