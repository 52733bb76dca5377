"""The serving lifecycle of ``HarborBackend``: prewarm before traffic, health while
serving, and a shutdown that leaves no sandbox or pool behind.

Kept apart from the per-rollout path (``backend.py``) because it concerns the backend as
a whole: environment groups, warm pools and every sandbox the process owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .harness import VENV, BundleInstallError, install_bundle
from .native import native_agent_config, scoped_api_key
from .prewarm import Prewarmer, PrewarmReport
from .sandbox import load_sandbox_sdk
from .sandbox.lifecycle import terminate_live_sandboxes
from .tasks import TaskMode


class BackendLifecycle:
    """Prewarm, shutdown and health for ``HarborBackend`` (mixed into it)."""

    async def prove_agent_setup(self, environment, *, deps_baked: bool) -> None:
        """Run the agent setup once in a started sandbox (prewarm's proof that it works)."""
        if self.bundle is not None and self.bundle.agent_script and not self.is_native:
            await install_bundle(environment, self.bundle.wheel, deps_preinstalled=deps_baked)
            probe = await environment.exec(f"{VENV / 'bin' / self.bundle.agent_script} --help")
            if probe.return_code != 0:
                raise BundleInstallError(
                    f"{self.bundle.agent_script} does not run in the sandbox: "
                    f"{(probe.stderr or probe.stdout or '').strip()[-500:]}")
        elif self.is_native and self.agent != "oracle":  # the oracle has no setup
            from harbor.agents.factory import AgentFactory

            with scoped_api_key(None) as key_env, tempfile.TemporaryDirectory() as logs:
                config = native_agent_config(self.agent, chat_completions_url="http://127.0.0.1/v1",
                                             api_key_env=key_env, model_name=self.model_name,
                                             native_agent_kwargs=self.native_agent_kwargs)
                agent = AgentFactory.create_agent_from_config(config, logs_dir=Path(logs))
                await agent.setup(environment)

    def default_prewarm_task_ids(self, task_ids: Sequence[str] | None) -> list[str]:
        if task_ids is not None:
            return list(task_ids)
        if self.task_mode is TaskMode.DATASET:
            raise ValueError("dataset mode needs explicit task ids: prewarm(['task-a', 'task-b'])")
        return self.resolver.task_ids()

    async def prewarm(self, task_ids: Sequence[str] | None = None, *, pool_size: int | None = None,
                      on_progress=None) -> PrewarmReport:
        """Build/push images, prove agent setup and size warm pools before any traffic."""
        ids = self.default_prewarm_task_ids(task_ids)
        report = await Prewarmer(self, pool_size=pool_size, on_progress=on_progress).run(ids)
        self.prewarm_report = report
        self.failed_prewarm_tasks.update(report.failed_tasks)
        for group in report.groups_detail:
            for task_id in group.task_ids:
                if group.pool and not group.error:
                    self._task_pools[task_id] = group.pool
                    self.failed_prewarm_tasks.pop(task_id, None)
        return report

    def prewarm_lifespan(self, task_ids: Sequence[str] | None = None):
        """An ASGI lifespan for ``create_rollout_server(lifespan=...)``: prewarm, then serve."""
        backend = self

        @contextlib.asynccontextmanager
        async def lifespan(_app: Any):
            await backend.prewarm(task_ids)
            yield

        return lifespan

    # ── lifecycle ─────────────────────────────────────────────────────────────
    _shutdown_run: asyncio.Future[None] | None = None  # the one shutdown, once started

    async def shutdown(self) -> None:
        """Stop admitting, cancel in-flight trials, remove every sandbox and pool we own.

        Idempotent: the first call does the work, later (or concurrent) calls wait for it.
        Served through ``osmosis_harbor.server.serve``, the drain has already let rollouts
        finish or cancelled them; this is the backstop for whatever is left."""
        self._accepting = False
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
        # outlive: finish that here. A trial still running keeps its marker (secrets.py).
        ended = [self.trials_dir / name for name, task in trials.items() if name and task.done()]
        await asyncio.to_thread(self.custody.seal_all, ended)
        problems = await terminate_live_sandboxes()
        problems += await self._delete_pools()
        self._remove_work_root()
        for problem in problems:
            print(f"HarborBackend shutdown: could not remove {problem}", flush=True)

    def _remove_work_root(self) -> None:
        """Remove the backend's temporary root, except retained (failed) trials in it."""
        root = self._work_root_path  # never made when no rollout ran: nothing to remove
        if root is not None:
            shutil.rmtree(root / "rollouts", ignore_errors=True)
        for directory in (self._trials_dir, root):
            try:
                if directory is not None:
                    directory.rmdir()  # only when empty: retained trials stay for inspection
            except OSError:
                pass

    async def _delete_pools(self) -> list[str]:
        pools = sorted(set(self._task_pools.values()))
        if not pools:
            return []
        sdk = load_sandbox_sdk(self.environment_config.kwargs.get("sdk", "skypilot"))
        problems = []
        for pool in pools:
            try:
                await sdk.delete_pool.aio(pool)
            except Exception as exc:
                problems.append(f"pool {pool}: {exc}")
        self._task_pools.clear()
        return problems

    def health(self) -> dict[str, Any]:
        counts = self.tracker.counts()
        return {
            "status": "ok" if self._accepting else "shutting_down",
            "backend": "harbor",
            "environment": self.environment_config.kwargs.get("sdk", str(self.environment_config.type)),
            "agent": self.agent if isinstance(self.agent, str) else f"{self.agent.__module__}:{self.agent.__qualname__}",
            "task_mode": self.task_mode.value,
            "in_flight": counts["in_flight"],
            "running": counts["running"] + counts["grading"],
            "grading": counts["grading"],
            "queued": self.tracker.queued(),  # what has_capacity() counts, admissions included
            "max_queue_depth": self.max_queue_depth,
            "prewarm": None if self.prewarm_report is None else {
                k: getattr(self.prewarm_report, k) for k in ("groups", "tasks", "built", "reused", "failed")},
            "failed_prewarm_tasks": dict(self.failed_prewarm_tasks),
            "pools": self._pool_state(),
        }

    def _pool_state(self) -> dict[str, Any]:
        pools = sorted(set(self._task_pools.values()))
        if not pools:
            return {}
        state: dict[str, Any] = {}
        try:
            sdk = load_sandbox_sdk(self.environment_config.kwargs.get("sdk", "skypilot"))
            for pool in pools:
                info = sdk.get_pool(pool)
                state[pool] = {"replicas": info.replicas, "idle": info.idle, "claimed": info.claimed}
        except Exception as exc:  # health must answer even when the pool API does not
            state["error"] = str(exc)
        return state


