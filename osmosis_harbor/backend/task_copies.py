"""The task copy a rollout runs, made as its plan says: what ``HarborBackend.materialize``
returns, and what prewarm builds and proves before any rollout asks for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.plan import Planner, Refusal
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.tasks.materialize import MaterializedTask
from osmosis_harbor.tasks.refs import ResolvedTask, TaskMode

__all__ = ["TaskCopies"]


class TaskCopies:
    """Copies of a backend's tasks, planned by its planner, and the request metadata that
    selects a task (so prewarm resolves and copies tasks as rollouts do)."""

    def __init__(self, options: BackendOptions, planner: Planner) -> None:
        self.options = options
        self.planner = planner

    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> MaterializedTask:
        """The task copy a graded rollout of ``task`` runs (``request=None``: without its input)."""
        plan = self.planner.plan(task, request)
        if isinstance(plan, Refusal):
            raise ConfigError(plan.message)
        return self.planner.materialize(plan, dest, request)

    def metadata_for_task(self, task_id: str) -> dict[str, Any] | None:
        """Request metadata that selects ``task_id``."""
        return None if self.options.task_mode is TaskMode.TEMPLATE else {"harbor_task_id": task_id}
