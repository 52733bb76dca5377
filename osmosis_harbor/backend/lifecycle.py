"""The serving lifecycle of a backend: prewarm before traffic, health while serving, and a
shutdown that leaves no sandbox, pool or temporary directory behind.

``BackendLifecycle`` is a collaborator of ``HarborBackend`` (which delegates ``prewarm``,
``prewarm_lifespan``, ``health`` and ``shutdown`` to it): it concerns the backend as a whole
(environment groups, warm pools, every sandbox the backend owns), not one rollout. It is also
what ``Prewarmer`` works with (``osmosis_harbor.prewarm.PrewarmTarget``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from harbor.environments.base import BaseEnvironment
from harbor.models.trial.config import EnvironmentConfig
from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor.agents.native import native_agent_config, scoped_api_key
from osmosis_harbor.agents.workflow import VENV, bundle_check_command, install_bundle, wrong_bundle_line
from osmosis_harbor.backend.admission import requires_public_url
from osmosis_harbor.backend.autoscale import AutoscalePolicy, PoolAutoscaler
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.plan import Planner, Refusal
from osmosis_harbor.backend.startup import BackgroundPrewarm
from osmosis_harbor.backend.tracker import RolloutTracker
from osmosis_harbor.backend.workspace import Workspace
from osmosis_harbor.bundle.info import BundleInfo
from osmosis_harbor.errors import BundleInstallError, ConfigError
from osmosis_harbor.keys import KeyCustody
from osmosis_harbor.prewarm import Prewarmer, PrewarmReport, ProgressCallback
from osmosis_harbor.sandbox.ledger.leftovers import Leftover, reap_dead_owners
from osmosis_harbor.sandbox.options import SandboxOptions, environment_label
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from osmosis_harbor.sandbox.sdk.registry import load_sandbox_sdk
from osmosis_harbor.tasks.materialize import MaterializedTask
from osmosis_harbor.tasks.refs import ResolvedTask, TaskMode
from osmosis_harbor.tasks.resolver import TaskResolver

logger = logging.getLogger(__name__)

__all__ = ["BackendLifecycle"]


class BackendLifecycle:
    """Prewarm, health and shutdown of one backend."""

    def __init__(
        self,
        options: BackendOptions,
        *,
        bundle: BundleInfo | None,
        resolver: TaskResolver,
        environment_config: EnvironmentConfig,
        tracker: RolloutTracker,
        custody: KeyCustody,
        workspace: Workspace,
        owner: SandboxOwner,
        planner: Callable[[], Planner],
    ) -> None:
        self.options = options
        self.bundle = bundle
        self.resolver = resolver
        self.environment_config = environment_config
        self.sandbox_options = SandboxOptions.of(environment_config)
        self.tracker = tracker
        self.custody = custody
        self.owner = owner  # the backend's: its sandboxes, pools and start bound, never another's
        self.workspace = workspace
        self._planner = planner
        self.accepting = True
        self.failed_prewarm_tasks: dict[str, str] = {}
        self.prewarm_report: PrewarmReport | None = None
        self.task_pools: dict[str, str] = {}
        self._shutdown_run: asyncio.Future[None] | None = None  # the one shutdown, once started
        self.autoscaler: PoolAutoscaler | None = None  # pool_size="auto": started after prewarm
        self.startup: BackgroundPrewarm | None = None  # a prewarm the server serves during

    @property
    def ready(self) -> bool:
        """Whether rollouts may be admitted: not while a background prewarm runs (or failed)."""
        return self.startup is None or self.startup.ready

    @property
    def sdk_name(self) -> str:
        return self.sandbox_options.sdk

    def reap_leftovers(self) -> list[Leftover]:
        """At start: remove what dead owners left on this backend's SDK (``leftovers.py``). An
        SDK that cannot answer now does not stop the start: the next start or ``cleanup`` retries."""
        try:
            return reap_dead_owners(self.sdk_name)
        except Exception as exc:
            logger.warning("could not reap what dead owners left on %s: %s", self.sdk_name, exc)
            return []

    # ── what Prewarmer needs (PrewarmTarget) ──────────────────────────────────
    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> MaterializedTask:
        """The task copy a graded rollout of ``task`` runs (``request=None``: without its input)."""
        planner = self._planner()
        plan = planner.plan(task, request)
        if isinstance(plan, Refusal):
            raise ConfigError(plan.message)
        return planner.materialize(plan, dest, request)

    def metadata_for_task(self, task_id: str) -> dict[str, Any] | None:
        """Request metadata that selects ``task_id`` (prewarm resolves tasks like rollouts)."""
        return None if self.options.task_mode is TaskMode.TEMPLATE else {"harbor_task_id": task_id}

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
    def default_prewarm_task_ids(self, task_ids: Sequence[str] | None) -> list[str]:
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
        ids = self.default_prewarm_task_ids(task_ids)
        policy = AutoscalePolicy.from_settings()
        size, auto = pools.prewarm_size(pool_size, self.sandbox_options.pool_size, policy.min_size)
        with owner_scope(self.owner):
            report = await Prewarmer(self, pool_size=size, on_progress=on_progress).run(ids)
        self.prewarm_report = report
        self.failed_prewarm_tasks.update(report.failed_tasks)
        for group in report.groups_detail:
            for task_id in group.task_ids:
                if group.pool and not group.error:
                    self.task_pools[task_id] = group.pool
                    self.failed_prewarm_tasks.pop(task_id, None)
        if auto:
            await self._autoscale(policy, initial_size=size)
        return report

    async def _autoscale(self, policy: AutoscalePolicy, *, initial_size: int) -> None:
        if self.autoscaler is not None:
            await self.autoscaler.stop()
            self.autoscaler = None
        names = sorted(set(self.task_pools.values()))
        if not names or self.owner.starts is None:
            return
        claims = self.owner.starts.claims
        self.autoscaler = PoolAutoscaler(
            load_sandbox_sdk(self.sdk_name), names, lambda: claims, policy, initial_size=initial_size
        )
        self.autoscaler.start()

    def prewarm_lifespan(
        self, task_ids: Sequence[str] | None = None, *, background: bool = False
    ) -> Callable[[Any], Any]:
        """An ASGI lifespan for ``create_rollout_server(lifespan=...)``: prewarm, then serve;
        ``background=True``: serve at once, ready for rollouts once prewarm is done
        (``backend.startup``)."""

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            if not background:
                await self.prewarm(task_ids)
                yield
                return
            startup = BackgroundPrewarm(len(self.default_prewarm_task_ids(task_ids)))
            self.startup = startup
            startup.start(lambda progress: self.prewarm(task_ids, on_progress=progress), app)
            try:
                yield
            finally:
                await startup.stop()

        return lifespan

    # ── shutdown ──────────────────────────────────────────────────────────────
    async def shutdown(self) -> None:
        """Stop admitting, cancel in-flight trials, remove every sandbox and pool we own.

        Idempotent: the first call does the work, later (or concurrent) calls wait for it.
        Served through ``osmosis_harbor.serving.server.serve``, the drain has already let
        rollouts finish or cancelled them; this is the backstop for whatever is left."""
        self.accepting = False
        if self._shutdown_run is None:
            self._shutdown_run = asyncio.ensure_future(self._shut_down())
        await asyncio.shield(self._shutdown_run)

    async def _shut_down(self) -> None:
        trials = {s.trial_name: s.task for s in self.tracker.in_flight() if s.task is not None and not s.task.done()}
        for task in trials.values():
            task.cancel()
        if trials:
            await asyncio.wait(trials.values(), timeout=60)
        # The rollouts seal their own trials as they end, in threads this process may not
        # outlive: finish that here. A trial still running keeps its marker (keys.py).
        ended = [self.workspace.trials_dir / name for name, task in trials.items() if name and task.done()]
        await asyncio.to_thread(self.custody.seal_all, ended)
        if self.autoscaler is not None:  # before the pools go: no resize races their deletion
            await self.autoscaler.stop()
        problems = await self.owner.close()
        problems += await pools.delete(self.owner.sandboxes, self.sdk_name, self.task_pools.values())
        self.task_pools.clear()
        self.workspace.remove()
        for problem in problems:
            print(f"HarborBackend shutdown: could not remove {problem}", flush=True)

    # ── health ────────────────────────────────────────────────────────────────
    def health(self, *, max_queue_depth: int | None, max_concurrent: int) -> dict[str, Any]:
        """The backend's state, in the shape osmosis-ai's own Harbor backend reports it (the
        harness reads ``chat_endpoint`` to choose a tunnel, and its in-flight capacity from
        ``max_queue_depth``, else ``concurrency.max_concurrent``), plus ours."""
        counts = self.tracker.counts()
        return {
            "status": self._status(),
            "ready": self.accepting and self.ready,
            "startup": None if self.startup is None else self.startup.state(),
            "chat_endpoint": {
                "environment": environment_label(self.environment_config),
                "requires_public_url": requires_public_url(self.options, self.environment_config),
            },
            "concurrency": {"max_concurrent": max_concurrent},
            "backend": "harbor",
            "environment": environment_label(self.environment_config),
            "agent": self.options.agent_label(),
            "task_mode": self.options.task_mode.value,
            "in_flight": counts["in_flight"],
            "running": counts["running"] + counts["grading"],
            "grading": counts["grading"],
            "queued": self.tracker.queued(),  # what has_capacity() counts, admissions included
            "max_queue_depth": max_queue_depth,
            "prewarm": None
            if self.prewarm_report is None
            else {k: getattr(self.prewarm_report, k) for k in ("groups", "tasks", "built", "reused", "failed")},
            "failed_prewarm_tasks": dict(self.failed_prewarm_tasks),
            "pools": pools.health(self.sdk_name, self.task_pools.values()),
            "autoscale": None if self.autoscaler is None else self.autoscaler.state(),
        }

    def _status(self) -> str:
        if not self.accepting:
            return "shutting_down"
        if self.startup is not None and not self.startup.ready:
            return "starting" if self.startup.error is None else "failed"
        return "ok"
