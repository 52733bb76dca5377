"""The leak audit as validation runs it: with ``--lint`` before the trials (``--lint=strict``
refuses a task with an audit error, phase ``task``), or on its own (``--audit``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from harbor.models.trial.config import EnvironmentConfig

from osmosis_harbor.audit import AuditFinding, AuditReport, AuditSeverity, AuditSubject, EnvironmentAudit, audit_tasks
from osmosis_harbor.audit.findings import incomplete
from osmosis_harbor.audit.run import ProgressCallback
from osmosis_harbor.errors import DatasetError
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.settings import Settings
from osmosis_harbor.tasks.discovery import TaskRef, check_task

__all__ = ["audit_dataset", "audit_findings", "refuse_audit_errors"]


async def audit_findings(
    tasks: Sequence[TaskRef],
    environment: EnvironmentConfig,
    config: Settings,
    *,
    n_concurrent: int,
    on_progress: ProgressCallback | None,
) -> tuple[AuditReport, dict[str, list[AuditFinding]]]:
    """The audit of ``tasks`` (in the caller's owner scope) and its findings per task id; an
    environment whose audit could not run gives its tasks a finding saying so."""
    subjects = [AuditSubject(task_id=t.id, path=t.path) for t in tasks]
    report = await audit_tasks(
        subjects, environment=environment, config=config, n_concurrent=n_concurrent, on_progress=on_progress
    )
    per_task: dict[str, list[AuditFinding]] = {t.id: [] for t in tasks}
    for audit in report.environments:
        for finding in audit.findings:
            per_task.setdefault(finding.task_id, []).append(finding)
    return report, per_task


def refuse_audit_errors(task: TaskRef, findings: list[AuditFinding]) -> None:
    """``--lint=strict``: a task whose sandbox holds an answer is refused before its trial."""
    errors = [f for f in findings if f.severity is AuditSeverity.ERROR]
    if not errors:
        return
    first = errors[0]
    more = f" (and {len(errors) - 1} more audit error(s))" if len(errors) > 1 else ""
    holder = f" ({first.ref})" if first.ref else ""
    raise DatasetError(
        f"task {task.id}: leak audit error {first.kind.value} at {first.path}{holder}: {first.evidence}; "
        f"{first.advice}{more}"
    )


async def audit_dataset(
    tasks: Sequence[TaskRef],
    *,
    environment: EnvironmentConfig,
    config: Settings,
    n_concurrent: int = 2,
    on_progress: ProgressCallback | None = None,
) -> AuditReport:
    """``validate --audit``: the audit alone, in an owner of its own (nothing outlives the call)."""
    runnable: list[TaskRef] = []
    invalid: list[EnvironmentAudit] = []
    for task in tasks:
        try:
            check_task(task)
        except DatasetError as exc:  # reported, as validation reports it; the rest is audited
            found = incomplete([task.id], ".", f"not audited: {exc}")
            invalid.append(EnvironmentAudit(environment_id="", task_ids=[task.id], error=str(exc), findings=found))
            continue
        runnable.append(task)
    impl = SandboxOptions.of(environment).impl
    owner = SandboxOwner.make("audit", config=config, starts=SandboxStarts(impl.max_concurrent_starts))
    try:
        with owner_scope(owner):
            report, _ = await audit_findings(
                runnable, environment, config, n_concurrent=n_concurrent, on_progress=on_progress
            )
    finally:
        await asyncio.shield(owner.close())
    return AuditReport(environments=report.environments + invalid)
