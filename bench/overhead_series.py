"""The overhead benchmark's samples (one ``Series`` per kind of rollout and latency) and how they
become figures: end-to-end, the workflow's own work, the overhead over the raw floor, the SDK
calls and Harbor's phases. Apart from ``bench.overhead``'s driver, which only measures."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .common import BenchResult, Figure

PHASES = ("environment", "agent_setup", "agent", "verifier", "total")


@dataclass
class Series:
    """The samples of one kind of rollout under one latency."""

    e2e: list[float] = field(default_factory=list)
    work: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    by_label: list[dict[str, tuple[int, float]]] = field(default_factory=list)  # per rollout: (count, seconds)
    calls: list[int] = field(default_factory=list)
    sdk_total: list[float] = field(default_factory=list)
    grader_log_missing: int = 0

    @property
    def overhead(self) -> list[float]:
        return [a - b for a, b in zip(self.e2e, self.work, strict=True)]

    def labels(self) -> set[str]:
        return {label for rollout in self.by_label for label in rollout}

    def sdk_seconds(self, label: str) -> list[float]:
        """Seconds in ``label`` calls per rollout (0 for a rollout without any)."""
        return [rollout.get(label, (0, 0.0))[1] for rollout in self.by_label]

    def sdk_count(self, label: str) -> list[int]:
        return [rollout.get(label, (0, 0.0))[0] for rollout in self.by_label]


def median_int(values: list[int]) -> int:
    return sorted(values)[len(values) // 2] if values else 0


def report_series(
    result: BenchResult, title: str, s: Series, floor: Figure, *, work_note: str, breakdown: bool
) -> tuple[Figure, Figure]:
    """Add one series' figures (and its overhead / floor ratio); returns (end-to-end, overhead)."""
    f_e2e = result.add(f"{title}: end-to-end (execute)", "s", s.e2e)
    result.add(f"  {title}: work in the sandbox", "s", s.work, work_note)
    f_over = result.add(f"{title}: overhead = e2e - work", "s", s.overhead)
    result.ratio(f"{title}: overhead / raw floor", f_over, floor)
    result.add(f"  {title}: sandbox SDK calls per rollout", "calls", s.calls, _exec_note(s))
    result.add(f"  {title}: in SDK calls (sum per rollout)", "s", s.sdk_total)
    for phase in PHASES if breakdown else ("agent_setup",):
        if s.phases.get(phase):
            note = "Harbor's TrialResult timings" if phase == "total" else ""
            result.add(f"  {title}: trial phase {phase}", "s", s.phases[phase], note)
    if breakdown:
        if s.phases.get("total"):
            result.add(
                f"  {title}: host time outside the trial = e2e - trial total",
                "s",
                [a - b for a, b in zip(s.e2e, s.phases["total"], strict=False)],
                "task copy, config, outcome reading",
            )
        result.add(
            f"  {title}: host Python outside SDK calls = e2e - SDK",
            "s",
            [a - b for a, b in zip(s.e2e, s.sdk_total, strict=False)],
            "Harbor trial + backend bookkeeping",
        )
        for label in sorted(s.labels(), key=lambda k: -statistics.median(s.sdk_seconds(k))):
            note = f"{median_int(s.sdk_count(label))} call(s) per rollout"
            result.add(f"    sdk {label}", "s", s.sdk_seconds(label), note)
    return f_e2e, f_over


def _exec_note(s: Series) -> str:
    execs = sum(median_int(s.sdk_count(label)) for label in s.labels() if label.startswith("exec"))
    return f"of which exec: {execs} (median per label)"


def add_floor(result: BenchResult, floor: dict[str, list[float]], suffix: str) -> Figure:
    f_floor = result.add(f"raw floor: create + exec + terminate{suffix}", "s", floor["total"], baseline=True)
    for step in ("create", "exec", "terminate"):
        result.add(f"  floor step: {step}{suffix}", "s", floor[step])
    return f_floor


def median_or_nan(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def over_floor(figure: Figure, floor: Figure) -> float:
    return figure.median / floor.median if floor.n and figure.n else math.nan
