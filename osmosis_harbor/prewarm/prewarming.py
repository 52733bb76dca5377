"""``Prewarming``: a backend's prewarm. The ``Warmer`` run over its tasks in its sandboxes (what
came of it goes to its ``Prewarmed``), the pool autoscaler that follows a ``pool_size="auto"``
prewarm, and the ASGI lifespan that prewarms a server (before it serves, or while: ``Startup``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from harbor.environments.base import BaseEnvironment
from harbor.models.trial.config import EnvironmentConfig
from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor.errors import ConfigError
from osmosis_harbor.prewarm.autoscale import AutoscalePolicy, PoolAutoscaler
from osmosis_harbor.prewarm.prewarmed import Prewarmed
from osmosis_harbor.prewarm.report import PrewarmReport
from osmosis_harbor.prewarm.setup_proof import AgentSetup
from osmosis_harbor.prewarm.startup import Startup
from osmosis_harbor.prewarm.warmer import ProgressCallback, Warmer
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from osmosis_harbor.sandbox.sdk.registry import load_sandbox_sdk
from osmosis_harbor.settings import Settings
from osmosis_harbor.tasks.materialize import MaterializedTask
from osmosis_harbor.tasks.refs import ResolvedTask
from osmosis_harbor.tasks.resolver import TaskResolver

__all__ = ["Prewarming", "TaskCopier"]


class TaskCopier(Protocol):
    """How a backend copies its tasks for a rollout (prewarm builds and proves the same copy)."""

    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> MaterializedTask: ...

    def metadata_for_task(self, task_id: str) -> dict[str, Any] | None: ...


class Prewarming:
    """Prewarm of one backend, in its owner's scope; the ``PrewarmTarget`` the ``Warmer`` works with."""

    def __init__(
        self,
        setup: AgentSetup,
        *,
        resolver: TaskResolver,
        environment_config: EnvironmentConfig,
        copies: TaskCopier,
        owner: SandboxOwner,
        prewarmed: Prewarmed,
        needs_task_ids: bool,
        autoscale: AutoscalePolicy,
        settings: Settings,
    ) -> None:
        """``needs_task_ids``: a dataset's tasks are named by the caller, a template's are listed."""
        self.setup = setup
        self.resolver = resolver
        self.environment_config = environment_config
        self.sandbox_options = SandboxOptions.of(environment_config)
        self.copies = copies
        self.owner = owner  # the backend's: its sandboxes, pools and start bound, never another's
        self.prewarmed = prewarmed
        self.needs_task_ids = needs_task_ids
        self.autoscale_policy = autoscale
        self.settings = settings  # the backend's (the leak audit's bounds)
        self.autoscaler: PoolAutoscaler | None = None  # pool_size="auto": started after prewarm
        self.startup: Startup | None = None  # a prewarm the server serves during

    @property
    def ready(self) -> bool:
        """False while a background prewarm runs, or after it failed."""
        return self.startup is None or self.startup.ready

    # ── what the Warmer needs (PrewarmTarget) ─────────────────────────────────
    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> MaterializedTask:
        return self.copies.materialize(task, dest, request=request)

    def metadata_for_task(self, task_id: str) -> dict[str, Any] | None:
        return self.copies.metadata_for_task(task_id)

    async def prove_agent_setup(
        self, environment: BaseEnvironment, *, deps_baked: bool, bundle_baked: str | None = None
    ) -> None:
        await self.setup.prove(environment, deps_baked=deps_baked, bundle_baked=bundle_baked)

    # ── prewarm ───────────────────────────────────────────────────────────────
    def default_task_ids(self, task_ids: Sequence[str] | None) -> list[str]:
        if task_ids is not None:
            return list(task_ids)
        if self.needs_task_ids:
            raise ConfigError("dataset mode needs explicit task ids: prewarm(['task-a', 'task-b'])")
        return self.resolver.task_ids()

    async def prewarm(
        self,
        task_ids: Sequence[str] | None = None,
        *,
        pool_size: int | Literal["auto"] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> PrewarmReport:
        """Build/push images, prove agent setup and size warm pools before any traffic
        (``pool_size="auto"``: at the autoscaler's minimum, then resized from the claims)."""
        ids = self.default_task_ids(task_ids)
        policy = self.autoscale_policy
        size, auto = pools.prewarm_size(pool_size, self.sandbox_options.pool_size, policy.min_size)
        with owner_scope(self.owner):
            report = await Warmer(self, pool_size=size, on_progress=on_progress).run(ids)
        self.prewarmed.record(report)
        if auto:
            await self._autoscale(policy, initial_size=size)
        return report

    async def _autoscale(self, policy: AutoscalePolicy, *, initial_size: int) -> None:
        if self.autoscaler is not None:
            await self.autoscaler.stop()
            self.autoscaler = None
        names = self.prewarmed.pool_names()
        if not names or self.owner.starts is None:
            return
        sdk = load_sandbox_sdk(self.sandbox_options.sdk)
        self.autoscaler = PoolAutoscaler(sdk, names, self.owner.starts.claims, policy, initial_size=initial_size)
        self.autoscaler.start()

    async def stop_autoscaler(self) -> None:
        """Stop resizing pools (before they are deleted: no resize races their deletion); its
        last state stays for ``health()``."""
        if self.autoscaler is not None:
            await self.autoscaler.stop()

    def lifespan(self, task_ids: Sequence[str] | None = None, *, background: bool = False) -> Callable[[Any], Any]:
        """An ASGI lifespan for ``create_rollout_server(lifespan=...)``: prewarm, then serve;
        ``background=True``: serve at once, ready for rollouts once prewarm is done
        (``startup``)."""

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            if not background:
                await self.prewarm(task_ids)
                yield
                return
            startup = Startup(len(self.default_task_ids(task_ids)))
            self.startup = startup
            startup.start(lambda progress: self.prewarm(task_ids, on_progress=progress), app)
            try:
                yield
            finally:
                await startup.stop()

        return lifespan
