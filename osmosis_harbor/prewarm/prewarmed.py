"""``Prewarmed``: what a backend's prewarms made of its tasks, which its rollouts then read."""

from __future__ import annotations

from osmosis_harbor import settings
from osmosis_harbor.audit import AuditFinding, AuditSeverity
from osmosis_harbor.prewarm.report import PrewarmReport

__all__ = ["Prewarmed"]


class Prewarmed:
    """The warm pool each task claims from (the backend's planner reads it), the tasks that
    failed and why (their rollouts are refused with that), each task's leak audit findings, and
    the last report (``health()``)."""

    def __init__(self, current: settings.Settings) -> None:
        self.settings = current
        self.task_pools: dict[str, str] = {}
        self.failed_tasks: dict[str, str] = {}
        self.leaks: dict[str, list[AuditFinding]] = {}  # each prewarmed task's leak audit findings
        self.report: PrewarmReport | None = None

    def record(self, report: PrewarmReport) -> None:
        self.report = report
        self.failed_tasks.update(report.failed_tasks)
        for group in report.groups_detail:
            if group.audit is not None:
                for task_id in group.task_ids:
                    self.leaks[task_id] = group.audit.for_task(task_id)
            for task_id in group.task_ids:
                if group.pool and not group.error:
                    self.task_pools[task_id] = group.pool
                    self.failed_tasks.pop(task_id, None)

    def leak_refusal(self, task_id: str) -> str | None:
        """Why a dataset task is refused for what its sandbox leaks (None: admitted), unless
        ``allow_leaking_tasks`` is set."""
        errors = [f for f in self.leaks.get(task_id, []) if f.severity is AuditSeverity.ERROR]
        if not errors or self.settings.allow_leaking_tasks:
            return None
        first = errors[0]
        holder = f" ({first.ref})" if first.ref else ""
        return (
            f"task {task_id} leaks its answer to the agent: {first.kind.value} at {first.path}{holder}: "
            f"{first.evidence}; {first.advice} (or set OSMOSIS_HARBOR_ALLOW_LEAKING_TASKS=1 to train on it)"
        )

    def pool_names(self) -> list[str]:
        return sorted(set(self.task_pools.values()))
