"""What a validation run reports: one row per task, and the report ``validate --json`` writes.

The models every reader of a run shares (the table, the JSON and JUnit reports, the causes noted
on failed rows), apart from the run that fills them.
"""

from __future__ import annotations

from pydantic import BaseModel

from osmosis_harbor.audit import AuditFinding, EnvironmentAudit
from osmosis_harbor.trials.verdict import StepVerdict
from osmosis_harbor.validate.lint import LintIssue

__all__ = ["TaskValidation", "ValidationReport"]


class TaskValidation(BaseModel):
    """One task's oracle verdict (a row of the table and of the JSON report)."""

    id: str
    passed: bool
    reward: float | None = None
    rewards: dict[str, float] = {}
    failed_phase: str | None = None
    error: str | None = None
    timings_sec: dict[str, float] = {}
    steps: list[StepVerdict] | None = None
    trial_dir: str | None = None
    lint: list[LintIssue] | None = None  # Harbor's lint findings, when --lint ran
    audit: list[AuditFinding] | None = None  # the leak audit's findings, when --lint ran
    stand_in: str | None = None  # the offline stand-in base image a solution or verifier failure ran on
    pool_note: str | None = None  # why the warm pool named could not serve this task (it ran cold)
    verification: dict[str, str] | None = None  # where the task's tests ran, and why (mode, reason)


class ValidationReport(BaseModel):
    """The machine-readable report written by ``validate --json``."""

    passed: int
    failed: int
    agent: str
    environment: str
    wall_sec: float
    tasks: list[TaskValidation]
    job_dir: str | None = None  # the kept trials, a Harbor job directory (harbor view)
    audits: list[EnvironmentAudit] | None = None  # the leak audit per environment, when --lint ran

    @property
    def ok(self) -> bool:
        return self.failed == 0
