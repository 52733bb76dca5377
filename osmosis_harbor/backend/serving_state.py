"""A backend as a server: whether it admits rollouts, the ``health()`` it reports, and the
shutdown that leaves no sandbox, pool or temporary directory behind."""

from __future__ import annotations

import asyncio
from typing import Any

from harbor.models.trial.config import EnvironmentConfig

from osmosis_harbor.backend.admission import requires_public_url
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.tracker import RolloutTracker
from osmosis_harbor.backend.workspace import Workspace
from osmosis_harbor.key_custody import KeyCustody
from osmosis_harbor.prewarm.prewarming import Prewarming
from osmosis_harbor.sandbox.options import SandboxOptions, environment_label
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner

__all__ = ["ServingState"]


class ServingState:
    """Admission, health and shutdown of one backend."""

    def __init__(
        self,
        options: BackendOptions,
        environment_config: EnvironmentConfig,
        *,
        tracker: RolloutTracker,
        custody: KeyCustody,
        workspace: Workspace,
        owner: SandboxOwner,
        prewarming: Prewarming,
    ) -> None:
        self.options = options
        self.environment_config = environment_config
        self.sdk_name = SandboxOptions.of(environment_config).sdk
        self.tracker = tracker
        self.custody = custody
        self.workspace = workspace
        self.owner = owner
        self.prewarming = prewarming
        self.accepting = True
        self._shutdown_run: asyncio.Future[None] | None = None  # the one shutdown, once started

    @property
    def ready(self) -> bool:
        """Whether rollouts may be admitted: not while a background prewarm runs (or failed)."""
        return self.prewarming.ready

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
        await self.prewarming.stop_autoscaler()
        task_pools = self.prewarming.prewarmed.task_pools
        problems = await self.owner.close()
        problems += await pools.delete(self.owner.sandboxes, self.sdk_name, task_pools.values())
        task_pools.clear()
        self.workspace.remove()
        for problem in problems:
            print(f"HarborBackend shutdown: could not remove {problem}", flush=True)

    # ── health ────────────────────────────────────────────────────────────────
    def health(self, *, max_queue_depth: int | None, max_concurrent: int, queued: int) -> dict[str, Any]:
        """The backend's state, in the shape osmosis-ai's own Harbor backend reports it (the
        harness reads ``chat_endpoint`` to choose a tunnel, and its in-flight capacity from
        ``max_queue_depth``, else ``concurrency.max_concurrent``), plus ours."""
        startup, autoscaler = self.prewarming.startup, self.prewarming.autoscaler
        prewarmed = self.prewarming.prewarmed
        report = prewarmed.report
        return {
            "status": self._status(),
            "ready": self.accepting and self.ready,
            "startup": None if startup is None else startup.state(),
            **rollout_health(
                self.options,
                self.environment_config,
                self.tracker,
                queued=queued,
                max_queue_depth=max_queue_depth,
                max_concurrent=max_concurrent,
            ),
            "prewarm": None
            if report is None
            else {k: getattr(report, k) for k in ("groups", "tasks", "built", "reused", "failed")},
            "failed_prewarm_tasks": dict(prewarmed.failed_tasks),
            "leak_audit": {
                task_id: [f.model_dump(mode="json") for f in found]
                for task_id, found in prewarmed.leaks.items()
                if found
            },
            "pools": pools.health(self.sdk_name, prewarmed.task_pools.values()),
            "autoscale": None if autoscaler is None else autoscaler.state(),
        }

    def _status(self) -> str:
        if not self.accepting:
            return "shutting_down"
        startup = self.prewarming.startup
        if startup is not None and not startup.ready:
            return "starting" if startup.error is None else "failed"
        return "ok"


def rollout_health(
    options: BackendOptions,
    environment_config: EnvironmentConfig,
    tracker: RolloutTracker,
    *,
    queued: int,
    max_queue_depth: int | None,
    max_concurrent: int,
) -> dict[str, Any]:
    """The part of ``/health`` in the shape osmosis-ai's own Harbor backend reports it (the
    harness reads ``chat_endpoint`` to choose a tunnel, and its in-flight capacity from
    ``max_queue_depth``, else ``concurrency.max_concurrent``): one backend's or a workers front's."""
    counts = tracker.counts()
    environment = environment_label(environment_config)
    return {
        "chat_endpoint": {
            "environment": environment,
            "requires_public_url": requires_public_url(options, environment_config),
        },
        "concurrency": {"max_concurrent": max_concurrent},
        "backend": "harbor",
        "environment": environment,
        "agent": options.agent_label(),
        "task_mode": options.task_mode.value,
        "in_flight": counts["in_flight"],
        "running": counts["running"] + counts["grading"],
        "grading": counts["grading"],
        "queued": queued,  # what has_capacity() counts, admissions included
        "max_queue_depth": max_queue_depth,
    }
