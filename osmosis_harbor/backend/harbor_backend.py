"""``HarborBackend``: the ``osmosis_ai`` execution backend that runs each rollout as a Harbor
trial in a SkyPilot sandbox (or a local Docker sandbox).

The facade checks the options, makes the user's queue treat our trial errors as their policies
say, and picks the job that runs the rollouts: ``InProcessBackend`` (``workers=1``: the trials
run in this process) or ``WorkerFront`` (``workers=N``: they run in N worker processes, and this
process admits, follows and cancels them). Both answer the osmosis server's calls; prewarm and
task copies exist only in process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Unpack

from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.types import ExecutionOutcome, ExecutionRequest

from osmosis_harbor.backend.construction import adopt_orchestrator
from osmosis_harbor.backend.in_process import InProcessBackend
from osmosis_harbor.backend.options import BackendKwargs, BackendOptions
from osmosis_harbor.backend.workers.front import WorkerFront
from osmosis_harbor.backend.workspace import Workspace
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.prewarm import PrewarmReport, ProgressCallback
from osmosis_harbor.tasks.materialize import MaterializedTask
from osmosis_harbor.tasks.refs import ResolvedTask

__all__ = ["HarborBackend"]


class HarborBackend(ExecutionBackend):
    """Runs Osmosis rollouts as Harbor trials in sandboxes (the v0.3 constructor)."""

    def __init__(self, **kwargs: Unpack[BackendKwargs]) -> None:
        options = BackendOptions.parse(**kwargs)
        self.options = options
        adopt_orchestrator(options)
        count = options.worker_count()
        self.job: InProcessBackend | WorkerFront = (
            WorkerFront(options, count) if count > 1 else InProcessBackend(options)
        )

    @property
    def front(self) -> WorkerFront | None:
        """The workers' front, when the trials run in worker processes."""
        return self.job if isinstance(self.job, WorkerFront) else None

    def __getattr__(self, name: str) -> Any:
        """The job's own parts (``tracker``, ``owner``, ``planner``, ...), for tools and tests."""
        if name == "job":  # not made yet: the constructor failed
            raise AttributeError(name)
        return getattr(self.job, name)

    @property
    def workspace(self) -> Workspace:
        return self.job.workspace

    @property
    def trials_dir(self) -> Path:
        return self.job.workspace.trials_dir

    @property
    def is_native(self) -> bool:
        return self.options.is_native

    # ── ExecutionBackend ──────────────────────────────────────────────────────
    def has_capacity(self) -> bool:
        """Whether the server may admit one more rollout (it asks once per admission).

        A yes holds a queue place until that rollout's execute() starts, so a burst of
        concurrent POSTs cannot overshoot ``max_queue_depth``."""
        return self.job.has_capacity()

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        return self.job.rollout_status(rollout_id)

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        return await self.job.execute(request)

    def cancel_rollouts(
        self, ids: Sequence[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        """Cancel matching rollouts: a queued one never starts a sandbox, a running one is
        stopped and its sandbox terminated."""
        return self.job.cancel_rollouts(ids, prefix, all)

    def health(self) -> dict[str, Any]:
        return self.job.health()

    async def shutdown(self) -> None:
        await self.job.shutdown()

    # ── prewarm (one process's: see osmosis_harbor.prewarm) ───────────────────────────
    async def prewarm(
        self,
        task_ids: Sequence[str] | None = None,
        *,
        pool_size: int | Literal["auto"] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> PrewarmReport:
        """Build/push images, prove agent setup and size warm pools before any traffic
        (``pool_size="auto"``: sized from the observed claim rate while serving)."""
        prewarming = self._in_process("prewarm()").prewarming
        return await prewarming.prewarm(task_ids, pool_size=pool_size, on_progress=on_progress)

    def prewarm_lifespan(self, task_ids: Sequence[str] | None = None, *, background: bool = False) -> Any:
        """An ASGI lifespan for ``create_rollout_server(lifespan=...)``: prewarm, then serve.
        ``background=True`` serves during prewarm (``/health`` shows its progress, rollouts get
        429 until it is done): what a harness with a start-up timeout needs."""
        return self._in_process("prewarm_lifespan()").prewarming.lifespan(task_ids, background=background)

    def _in_process(self, call: str) -> InProcessBackend:
        """The in-process job, for what only one process can do (its pools, its task copies)."""
        if isinstance(self.job, WorkerFront):
            raise ConfigError(
                f"{call} is not available with workers={self.job.count}: its pools belong to one process, "
                "and the trials run in the worker processes; serve without prewarm (images build on first use), "
                "or pass workers=1"
            )
        return self.job

    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> MaterializedTask:
        """The per-rollout task copy (``request=None``: the copy a graded rollout runs, which
        prewarm builds and proves)."""
        return self._in_process("materialize()").task_copies.materialize(task, dest, request=request)
