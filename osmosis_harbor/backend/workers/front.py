"""``WorkerFront``: the server process's half of ``HarborBackend(workers=N)``.

Why: one asyncio process drives trials on one core (about 0.1 s of host CPU per graded
rollout, so about 10 completions per second). The front keeps what the osmosis server talks to
(admission, each rollout's status, cancel, health, shutdown) and hands each rollout to the
least-loaded of N worker processes, each with its own ``TrialQueue``, SDK clients, policy relay
and event loop. The front does no trial work: its cost per rollout is a few messages.

A worker that dies loses only its own rollouts: once its process has exited, what it left is
reaped through the ledger (its pid is a dead owner), its unscrubbed trials are swept, its work
root removed, its rollouts end ``internal_error``, and a new worker takes its place.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from osmosis_ai.rollout.context import get_rollout_context
from osmosis_ai.rollout.types import ExecutionOutcome, ExecutionRequest, RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend.construction import default_environment, prepared_bundle, reap_leftovers
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.outcome import cancelled, refused
from osmosis_harbor.backend.reservations import Reservations
from osmosis_harbor.backend.serving_state import rollout_health
from osmosis_harbor.backend.tracker import TERMINAL, RolloutState, RolloutTracker
from osmosis_harbor.backend.workers.crossing import checked_facts, pickled_options, shares
from osmosis_harbor.backend.workers.handle import WORKER_DIED, Event, WorkerHandle
from osmosis_harbor.backend.workers.messages import Done, Init, Status, Submit
from osmosis_harbor.backend.workspace import Workspace
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.harbor_compat.queue_facts import queue_facts
from osmosis_harbor.key_custody import default_trials_dirs, sweep_unscrubbed
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.sdk.registry import implementation

__all__ = ["WorkerFront"]

log = logging.getLogger(__name__)

CANCEL_WAIT_SEC = 60.0  # a cancelled rollout's worker removes its sandbox within this (as shutdown does)
STOP_WAIT_SEC = 120.0


class WorkerFront:
    """Admission, status, cancel, health and shutdown for rollouts run in worker processes."""

    def __init__(self, options: BackendOptions, count: int) -> None:
        facts = queue_facts(options.orchestrator)  # before anything adds hooks to it
        checked_facts(facts, count, options.settings.relay_port)
        self.options = options
        self.count = count
        self._pickled = pickled_options(options, count)
        self._retry = facts.retry_config
        self._shares = shares(facts.n_concurrent, count)
        self.environment_config = options.environment_config or default_environment()
        self.sdk_name = SandboxOptions.of(self.environment_config).sdk
        self.workspace = Workspace(options.trials_dir)
        given = self.workspace.given_trials_dir()
        sweep_unscrubbed([d for d in (given,) if d is not None] + default_trials_dirs())
        reap_leftovers(self.sdk_name, self.options.settings)
        prepared_bundle(options)  # built once here: every worker finds it in the bundle cache
        self.tracker = RolloutTracker(None)
        self.reservations = Reservations(options.max_queue_depth, self.tracker.queued)
        self.accepting = True
        self.restarts = 0
        self._owners: dict[str, WorkerHandle] = {}
        self._generation = 0
        self._attaching: asyncio.Future[None] | None = None
        self._restarting: set[asyncio.Task[None]] = set()
        self.handles = [self._spawn(i) for i in range(count)]
        try:
            for handle in self.handles:
                handle.wait_ready()
        except BaseException:
            for handle in self.handles:
                handle.kill()
                handle.process.wait()
            self._remove_roots()
            self.workspace.remove()
            raise

    # ── workers ───────────────────────────────────────────────────────────────
    def _spawn(self, index: int) -> WorkerHandle:
        self._generation += 1
        init = Init(
            index=index,
            options=self._pickled,
            n_concurrent=self._shares[index],
            retry_config=self._retry,
            work_root=str(self.workspace.root / "workers" / f"{index}-{self._generation}"),
            trials_dir=str(self.workspace.trials_dir),
            sys_path=[p for p in sys.path if p],
        )
        return WorkerHandle(index, init)

    async def _attach(self) -> None:
        """Move every worker's socket onto the running loop, once: concurrent first rollouts
        all wait for the same attachment."""
        if self._attaching is None:
            self._attaching = asyncio.ensure_future(self._attach_all())
        await asyncio.shield(self._attaching)

    async def _attach_all(self) -> None:
        for handle in self.handles:
            if not handle.attached:
                await handle.attach(self._on_death)

    async def _on_death(self, handle: WorkerHandle) -> None:
        """The worker's process has exited: reap what it left, then (serving) start another."""
        if not handle.stopping:
            log.error(
                "worker %d (pid %d) died with exit status %s", handle.index, handle.pid, handle.process.returncode
            )
        await asyncio.to_thread(self._clean_after, handle)
        if handle.stopping or not self.accepting:
            return
        task = asyncio.create_task(self._restart(handle.index))
        self._restarting.add(task)
        task.add_done_callback(self._restarting.discard)

    def _clean_after(self, handle: WorkerHandle) -> None:
        shutil.rmtree(handle.work_root, ignore_errors=True)
        if handle.stopping and handle.process.returncode == 0:
            return  # drained: it removed its own sandboxes
        reap_leftovers(
            self.sdk_name, self.options.settings
        )  # its pid is a dead owner now: the ledger names its sandboxes
        sweep_unscrubbed([self.workspace.trials_dir])

    async def _restart(self, index: int) -> None:
        def start() -> WorkerHandle:
            handle = self._spawn(index)
            handle.wait_ready()
            return handle

        try:
            fresh = await asyncio.to_thread(start)
        except ConfigError as exc:
            log.error("worker %d could not be restarted: %s", index, exc)
            return
        if not self.accepting:
            await fresh.stop(STOP_WAIT_SEC)
            return
        await fresh.attach(self._on_death)
        self.handles[index] = fresh
        self.restarts += 1

    def _route(self) -> WorkerHandle | None:
        live = [h for h in self.handles if h.alive]
        return min(live, key=lambda h: h.load) if live else None

    # ── ExecutionBackend ──────────────────────────────────────────────────────
    def has_capacity(self) -> bool:
        if not self.accepting:
            return False
        return self.reservations.grant() is not None

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        return self.tracker.status(rollout_id)

    def worker_of(self, rollout_id: str) -> int | None:
        """The pid of the worker running ``rollout_id`` (None once it ended)."""
        handle = self._owners.get(rollout_id)
        return handle.pid if handle is not None else None

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        self.reservations.claim()  # the place has_capacity() held for this rollout
        if not self.accepting:
            return refused(
                "the backend is shutting down", {"failed_phase": "task"}, RolloutErrorCategory.INTERNAL_ERROR
            )
        await self._attach()
        ctx = get_rollout_context()
        listener = ctx.set_status if ctx is not None and ctx.progress is not None else None
        state = self.tracker.admit(request.id, listener)
        handle = self._route()
        if handle is None:
            return self.tracker.finish_with(request.id, self._lost("no worker process is alive"))
        url = ctx.chat_completions_url if ctx is not None else ""
        key = ctx.api_key if ctx is not None else None
        events = handle.submit(Submit(request=request, chat_completions_url=url, api_key=key))
        self._owners[request.id] = handle
        try:
            return await self._follow(state, events, handle)
        except asyncio.CancelledError:
            handle.cancel(request.id)
            await asyncio.shield(self._await_end(events))
            self.tracker.finish(request.id, RolloutStatus.CANCELLED, error="cancelled")
            raise
        finally:
            self._owners.pop(request.id, None)
            handle.forget(request.id)

    async def _follow(
        self, state: RolloutState, events: asyncio.Queue[Event], handle: WorkerHandle
    ) -> ExecutionOutcome:
        """Mirror the worker's status changes for one rollout until its end."""
        while True:
            event = await events.get()
            if isinstance(event, Status):
                if event.status in TERMINAL or state.status in TERMINAL:
                    continue
                self.tracker.set_status(state, event.status)
                if event.trial_name and event.task_id:
                    self.tracker.bind_trial(state.rollout_id, event.trial_name, event.task_id)
                state.started_at = event.started_at or state.started_at
                if state.listener is not None:
                    await state.listener(event.status)
                continue
            if event == WORKER_DIED:
                message = f"worker process {handle.index} (pid {handle.pid}) died while running this rollout"
                return self.tracker.finish_with(state.rollout_id, self._lost(message))
            assert isinstance(event, Done)
            if event.error is not None:
                self.tracker.finish(
                    state.rollout_id,
                    RolloutStatus.FAILURE,
                    error=event.error,
                    err_category=RolloutErrorCategory.INTERNAL_ERROR,
                )
                raise RuntimeError(event.error)
            outcome = event.outcome if event.outcome is not None else cancelled({"failed_phase": "task"})
            return self.tracker.finish_with(state.rollout_id, outcome)

    @staticmethod
    async def _await_end(events: asyncio.Queue[Event]) -> None:
        try:
            async with asyncio.timeout(CANCEL_WAIT_SEC):
                while not isinstance(event := await events.get(), Done) and event != WORKER_DIED:
                    pass
        except TimeoutError:
            pass

    def _lost(self, message: str) -> ExecutionOutcome:
        return refused(message, {"failed_phase": "environment"}, RolloutErrorCategory.INTERNAL_ERROR)

    def cancel_rollouts(
        self, ids: Sequence[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        """Cancel matching rollouts in whichever worker runs each."""
        dispositions: dict[str, str] = {}
        for rollout_id in self.tracker.select(ids, prefix, all):
            state = self.tracker.get(rollout_id)
            handle = self._owners.get(rollout_id)
            if state is None or state.status in TERMINAL or handle is None:
                dispositions[rollout_id] = "not_found"
                continue
            state.cancel_requested = True
            handle.cancel(rollout_id)
            queued = state.status is RolloutStatus.QUEUED
            dispositions[rollout_id] = "cancelled_queued" if queued else "cancelled_running"
        return dispositions

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.accepting else "shutting_down",
            "ready": self.accepting and any(h.alive for h in self.handles),
            **rollout_health(
                self.options,
                self.environment_config,
                self.tracker,
                queued=self.reservations.queued(),
                max_queue_depth=self.options.max_queue_depth,
                max_concurrent=sum(self._shares),
            ),
            "workers": {
                "count": self.count,
                "restarts": self.restarts,
                "processes": [
                    {"index": h.index, "pid": h.pid, "alive": h.alive, "in_flight": len(h.pending)}
                    for h in self.handles
                ],
            },
        }

    async def shutdown(self) -> None:
        """Stop admitting, drain every worker (each cancels what still runs and removes its
        sandboxes), then remove the work root and what a killed worker left."""
        self.accepting = False
        if self._restarting:
            await asyncio.gather(*self._restarting, return_exceptions=True)
        clean = await asyncio.gather(*(h.stop(STOP_WAIT_SEC) for h in self.handles))
        if not all(clean):
            await asyncio.to_thread(reap_leftovers, self.sdk_name, self.options.settings)
        self._remove_roots()
        self.workspace.remove()
        await asyncio.to_thread(implementation(self.sdk_name).stop_local_servers)

    def _remove_roots(self) -> None:
        shutil.rmtree(self.workspace.root / "workers", ignore_errors=True)
