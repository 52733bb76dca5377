"""The audit's findings: one pydantic model per row of the table, the JSON report and /health.

Every text in a finding that came from the sandbox (paths, ref names, commit subjects) is made
printable and bounded before it is stored, so a report never carries a terminal escape or a
token-length run of a secret the image might hold."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

from osmosis_harbor.sandbox.transfer.extract.limits import masked
from osmosis_harbor.trials.printable import printable

__all__ = ["AuditFinding", "AuditKind", "AuditReport", "AuditSeverity", "EnvironmentAudit", "shown"]


class AuditSeverity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


class AuditKind(StrEnum):
    """What was found. ``audit-incomplete`` is the audit saying where it stopped (a bound hit, a
    tool missing in the image): nothing was found there, and nothing was proven clean either."""

    GIT_HISTORY = "git-history"  # commits after HEAD's that a ref, the reflog or an object holds
    TESTS_COPY = "tests-copy"  # a file equal to one of the task's tests/ (expected outputs: error)
    SOLUTION_COPY = "solution-copy"  # a file equal to one of the task's solution/
    CONTAINS = "contains"  # a file containing a distinctive line of tests/ or solution/
    INCOMPLETE = "audit-incomplete"


ADVICE = {
    AuditKind.GIT_HISTORY: (
        "ship the repository as a shallow clone at the base commit (git clone --depth 1, or delete the "
        "ref, expire the reflog and git gc --prune=now in the Dockerfile)"
    ),
    AuditKind.TESTS_COPY: "remove the file from the image (tests are uploaded only when the verifier runs)",
    AuditKind.SOLUTION_COPY: "remove the file from the image (the solution must not ship with the task)",
    AuditKind.CONTAINS: "remove or rewrite the file: it contains lines of the task's tests or solution",
    AuditKind.INCOMPLETE: "raise the bound named in the evidence (README settings) or audit the image by hand",
}


def shown(text: str, limit: int = 200) -> str:
    """Sandbox-made text as a finding keeps it: one printable line, long token runs masked."""
    return masked(printable(text, newlines=False), limit)


class AuditFinding(BaseModel):
    """One leak (or one place the audit could not look), with what an agent would run to read it."""

    task_id: str
    kind: AuditKind
    severity: AuditSeverity
    path: str  # in the sandbox: the repository's .git, or the file
    evidence: str
    advice: str
    read_with: str | None = None  # how an agent would read it (git log --all, git reflog, cat ...)
    repository: str | None = None  # git findings: the repository (its .git directory)
    ref: str | None = None  # git findings: the ref, reflog or object that holds the history


class EnvironmentAudit(BaseModel):
    """One environment's audit: its findings for every task that shares it, and what it read."""

    environment_id: str
    task_ids: list[str]
    findings: list[AuditFinding] = []
    workdir: str | None = None  # the image's working directory, as the agent starts in it
    repositories: list[str] = []  # the .git directories found in the sandbox
    files_hashed: int = 0
    wall_sec: float = 0.0
    error: str | None = None  # the audit itself failed (the image did not start, ...)

    def for_task(self, task_id: str) -> list[AuditFinding]:
        return [f for f in self.findings if f.task_id == task_id]


class AuditReport(BaseModel):
    """What ``validate --audit --json`` writes: every environment's audit."""

    environments: list[EnvironmentAudit]

    @property
    def findings(self) -> list[AuditFinding]:
        return [f for e in self.environments for f in e.findings]

    @property
    def errors(self) -> list[AuditFinding]:
        return [f for f in self.findings if f.severity is AuditSeverity.ERROR]
