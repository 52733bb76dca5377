"""The leak audit: answers lying in the agent's sandbox (git history beyond HEAD, copies of the
task's tests or solution), read from the task's real image before any training sees it."""

from osmosis_harbor.audit.models import AuditFinding, AuditKind, AuditReport, AuditSeverity, EnvironmentAudit
from osmosis_harbor.audit.run import AuditSubject, audit_sandbox, audit_tasks

__all__ = [
    "AuditFinding",
    "AuditKind",
    "AuditReport",
    "AuditSeverity",
    "AuditSubject",
    "EnvironmentAudit",
    "audit_sandbox",
    "audit_tasks",
]
