"""A backend's prewarm: ``Prewarmer`` run over its tasks in its sandboxes, what came of it
(each task's warm pool, the tasks that failed), the agent setup proof, the pool autoscaler
that follows a ``pool_size="auto"`` prewarm, and the ASGI lifespan that prewarms a server."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from harbor.environments.base import BaseEnvironment
from harbor.models.trial.config import EnvironmentConfig
from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor import settings
from osmosis_harbor.agents.native import native_agent_config, scoped_api_key
from osmosis_harbor.agents.workflow import VENV, bundle_check_command, install_bundle, wrong_bundle_line
from osmosis_harbor.audit import AuditFinding, AuditSeverity
from osmosis_harbor.backend.autoscale import AutoscalePolicy, PoolAutoscaler
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.startup import BackgroundPrewarm
from osmosis_harbor.backend.task_copies import TaskCopies
from osmosis_harbor.bundle.info import BundleInfo
from osmosis_harbor.errors import BundleInstallError, ConfigError
from osmosis_harbor.prewarm import Prewarmer, PrewarmReport, ProgressCallback
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from osmosis_harbor.sandbox.sdk.registry import load_sandbox_sdk
from osmosis_harbor.tasks.materialize import MaterializedTask
from osmosis_harbor.tasks.refs import ResolvedTask, TaskMode
from osmosis_harbor.tasks.resolver import TaskResolver

__all__ = ["BackendPrewarm", "PrewarmedTasks"]


class PrewarmedTasks:
    """What a backend's prewarms made of its tasks: the warm pool each task claims from (its
    planner reads it), the tasks that failed and why (its rollouts are refused with that), and
    the last report (``health()``)."""

    def __init__(self) -> None:
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
        if not errors or settings.current().allow_leaking_tasks:
            return None
        first = errors[0]
        holder = f" ({first.ref})" if first.ref else ""
        return (
            f"task {task_id} leaks its answer to the agent: {first.kind.value} at {first.path}{holder}: "
            f"{first.evidence}; {first.advice} (or set OSMOSIS_HARBOR_ALLOW_LEAKING_TASKS=1 to train on it)"
        )

    def pool_names(self) -> list[str]:
        return sorted(set(self.task_pools.values()))


class BackendPrewarm:
    """Prewarm of one backend, in its owner's scope; the ``PrewarmTarget`` ``Prewarmer`` works with."""

    def __init__(
        self,
        options: BackendOptions,
        *,
        bundle: BundleInfo | None,
        resolver: TaskResolver,
        environment_config: EnvironmentConfig,
        copies: TaskCopies,
        owner: SandboxOwner,
        prewarmed: PrewarmedTasks,
    ) -> None:
        self.options = options
        self.bundle = bundle
        self.resolver = resolver
        self.environment_config = environment_config
        self.sandbox_options = SandboxOptions.of(environment_config)
        self.copies = copies
        self.owner = owner  # the backend's: its sandboxes, pools and start bound, never another's
        self.prewarmed = prewarmed
        self.autoscaler: PoolAutoscaler | None = None  # pool_size="auto": started after prewarm
        self.startup: BackgroundPrewarm | None = None  # a prewarm the server serves during

    @property
    def ready(self) -> bool:
        """False while a background prewarm runs, or after it failed."""
        return self.startup is None or self.startup.ready

    # ── what Prewarmer needs (PrewarmTarget) ──────────────────────────────────
    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> MaterializedTask:
        return self.copies.materialize(task, dest, request=request)

    def metadata_for_task(self, task_id: str) -> dict[str, Any] | None:
        return self.copies.metadata_for_task(task_id)

    async def prove_agent_setup(
        self, environment: BaseEnvironment, *, deps_baked: bool, bundle_baked: str | None = None
    ) -> None:
        """Run the agent setup once in a started sandbox (prewarm's proof that it works): with
        the bundle baked into the image, one exec checks its marker and runs the console script,
        as a trial's would; otherwise the wheel is pip-installed first."""
        if self.bundle is not None and self.bundle.agent_script and not self.options.is_native:
            probe_command = f"{VENV / 'bin' / self.bundle.agent_script} --help"
            if bundle_baked is not None:
                probe_command = f"{bundle_check_command(bundle_baked)}; {probe_command}"
            else:
                await install_bundle(environment, self.bundle.wheel, deps_preinstalled=deps_baked)
            probe = await environment.exec(probe_command)
            if wrong := wrong_bundle_line(probe.return_code, probe.stderr):
                raise BundleInstallError(wrong)
            if probe.return_code != 0:
                raise BundleInstallError(
                    f"{self.bundle.agent_script} does not run in the sandbox: "
                    f"{(probe.stderr or probe.stdout or '').strip()[-500:]}"
                )
        elif self.options.is_native and self.options.agent != "oracle":  # the oracle has no setup
            from harbor.agents.factory import AgentFactory

            assert isinstance(self.options.agent, str)
            with scoped_api_key(None) as key_env, tempfile.TemporaryDirectory() as logs:
                config = native_agent_config(
                    self.options.agent,
                    chat_completions_url="http://127.0.0.1/v1",
                    api_key_env=key_env,
                    model_name=self.options.model_name,
                    native_agent_kwargs=self.options.native_agent_kwargs,
                )
                agent = AgentFactory.create_agent_from_config(config, logs_dir=Path(logs))
                await agent.setup(environment)

    # ── prewarm ───────────────────────────────────────────────────────────────
    def default_task_ids(self, task_ids: Sequence[str] | None) -> list[str]:
        if task_ids is not None:
            return list(task_ids)
        if self.options.task_mode is TaskMode.DATASET:
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
        policy = AutoscalePolicy.from_settings()
        size, auto = pools.prewarm_size(pool_size, self.sandbox_options.pool_size, policy.min_size)
        with owner_scope(self.owner):
            report = await Prewarmer(self, pool_size=size, on_progress=on_progress).run(ids)
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
            startup = BackgroundPrewarm(len(self.default_task_ids(task_ids)))
            self.startup = startup
            startup.start(lambda progress: self.prewarm(task_ids, on_progress=progress), app)
            try:
                yield
            finally:
                await startup.stop()

        return lifespan
