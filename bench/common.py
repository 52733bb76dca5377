"""Figures, ratios and results: the shapes every benchmark reports, printed with rich
and written to JSON.

A ``Figure`` keeps its raw samples so the JSON has everything needed to recompute a
statistic later; the table shows n, median, p90 and min. A ``Ratio`` relates two medians
measured in the same run (the benchmark's figure over its baseline), which is the number
to compare across machines and runs.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100), like numpy's default."""
    if not samples:
        return math.nan
    data = sorted(samples)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass
class Figure:
    """One measured quantity: its samples and how to read them."""

    name: str
    unit: str
    samples: list[float]
    note: str = ""
    baseline: bool = False  # the same-run reference other figures are divided by

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def p90(self) -> float:
        return percentile(self.samples, 90)

    @property
    def min(self) -> float:
        return min(self.samples) if self.samples else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "n": self.n,
            "median": _num(self.median),
            "p90": _num(self.p90),
            "min": _num(self.min),
            "baseline": self.baseline,
            "note": self.note,
            "samples": [round(s, 6) for s in self.samples],
        }


@dataclass
class Ratio:
    """``numerator`` median / ``denominator`` median, both figures of the same run."""

    name: str
    numerator: str
    denominator: str
    value: float
    note: str = ""


@dataclass
class BenchResult:
    """What one benchmark reports."""

    name: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # counts and facts (builds, leaks, sizes)
    # The values the issue-10 targets table reads (``bench.targets``), by stable key.
    # A value may be an object of figures too (``workers``' completions_per_s, keyed by worker count).
    headline: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    wall_sec: float = 0.0
    error: str | None = None

    def add(self, name: str, unit: str, samples: Sequence[float], note: str = "", *, baseline: bool = False) -> Figure:
        figure = Figure(name, unit, [float(s) for s in samples], note, baseline)
        self.figures.append(figure)
        return figure

    def ratio(self, name: str, numerator: Figure, denominator: Figure, note: str = "") -> Ratio:
        den = denominator.median
        value = numerator.median / den if den and not math.isnan(den) else math.nan
        ratio = Ratio(name, numerator.name, denominator.name, value, note)
        self.ratios.append(ratio)
        return ratio

    def headline_value(self, key: str, value: float | None) -> None:
        self.headline[key] = None if value is None or math.isnan(value) else float(value)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        console.print(f"[bold yellow]WARNING[/] {self.name}: {message}")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "wall_sec": round(self.wall_sec, 3),
            "figures": [f.to_json() for f in self.figures],
            "ratios": [{**asdict(r), "value": _num(r.value)} for r in self.ratios],
            "info": self.info,
            "headline": {k: _num(v) for k, v in self.headline.items()},
            "notes": self.notes,
            "warnings": self.warnings,
            "error": self.error,
        }


def _num(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _num(v) for k, v in value.items()}
    return None if value is None or math.isnan(value) else round(value, 6)


def fmt(value: float, unit: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    if unit in {"s"}:
        return f"{value:.3f}"
    if unit in {"ms", "us"}:
        return f"{value:.2f}" if value < 100 else f"{value:.0f}"
    if unit in {"KiB", "MiB", "bytes"}:
        return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def render(result: BenchResult) -> None:
    """Print one benchmark: its figures, its ratios, then facts and notes."""
    table = Table(title=f"{result.name}: {result.title}  ({result.wall_sec:.1f} s)", title_justify="left")
    for column, justify in (
        ("figure", "left"),
        ("unit", "left"),
        ("n", "right"),
        ("median", "right"),
        ("p90", "right"),
        ("min", "right"),
        ("note", "left"),
    ):
        table.add_column(column, justify=justify, overflow="fold")
    for f in result.figures:
        name = f"{f.name} [dim](baseline)[/]" if f.baseline else f.name
        table.add_row(name, f.unit, str(f.n), fmt(f.median, f.unit), fmt(f.p90, f.unit), fmt(f.min, f.unit), f.note)
    for r in result.ratios:
        table.add_row(
            f"[bold]ratio[/] {r.name}",
            "x",
            "",
            f"[bold]{r.value:.2f}[/]" if not math.isnan(r.value) else "-",
            "",
            "",
            r.note,
        )
    console.print(table)
    for key, value in result.info.items():
        if not isinstance(value, (dict, list)):
            console.print(f"  {key}: {value}")
    for note in result.notes:
        console.print(f"  [dim]{note}[/]")
    if result.error:
        console.print(f"  [bold red]error:[/] {result.error}")


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box = [math.nan]
    started = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - started
