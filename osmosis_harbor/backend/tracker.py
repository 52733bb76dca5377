"""Where each rollout is: its status, fed by the TrialQueue's hooks, kept after it ends.

Harbor's ``TrialQueue`` runs trials under a semaphore but exposes neither status nor
cancellation: ``submit()`` returns an unscheduled coroutine, a trial waiting for a slot
is invisible, and cancelling is cancelling the task. ``RolloutTracker`` wraps each
submission in a task it owns, learns from the queue's hooks when a trial leaves the
queue (``START``) and when it reaches verification, and keeps terminal states for a
retention window so a controller can poll them after the fact. Whether a rollout may come in
at all is admission's (``reservations.py``), not the tracker's.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harbor.trial.hooks import TrialEvent, TrialHookEvent
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import ExecutionOutcome, RolloutStatus

TERMINAL = {RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED}
StatusListener = Callable[[RolloutStatus], Awaitable[None]]


@dataclass
class RolloutState:
    """What the backend knows about one rollout."""

    rollout_id: str
    status: RolloutStatus = RolloutStatus.QUEUED
    trial_name: str | None = None
    task_id: str | None = None
    admitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    reward: float | None = None
    error: str | None = None
    err_category: str | None = None
    task: asyncio.Future[Any] | None = None  # the trial, once submitted (cancel target)
    cancel_requested: bool = False
    listener: StatusListener | None = None

    def public(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "rollout_id": self.rollout_id,
            "status": self.status,
            "task_id": self.task_id,
            "trial_name": self.trial_name,
            "admitted_at": self.admitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
        if self.status in TERMINAL:
            data.update(reward=self.reward, error=self.error, err_category=self.err_category)
        return data


class RolloutTracker:
    """Status of every rollout this backend admitted, fed by the queue's hooks."""

    def __init__(self, orchestrator: TrialQueue | None, *, retention_sec: float = 3600.0) -> None:
        """``orchestrator=None``: a front's tracker (``backend/workers/``), fed by its workers'
        messages instead of a queue's hooks."""
        self._states: dict[str, RolloutState] = {}
        self._by_trial: dict[str, str] = {}
        self._retention_sec = retention_sec
        # Kept incrementally so that admission, has_capacity() and health stay O(1) with
        # tens of thousands of rollouts queued.
        self._counts: Counter[RolloutStatus] = Counter()
        self._finished: deque[tuple[float, str]] = deque()
        if orchestrator is not None:
            orchestrator.add_hook(TrialEvent.START, self._on_event(RolloutStatus.RUNNING))
            orchestrator.add_hook(TrialEvent.VERIFICATION_START, self._on_event(RolloutStatus.GRADING))

    # ── lifecycle ─────────────────────────────────────────────────────────────
    def admit(self, rollout_id: str, listener: StatusListener | None = None) -> RolloutState:
        self._expire()
        previous = self._states.get(rollout_id)
        if previous is not None:
            self._counts[previous.status] -= 1
        state = RolloutState(rollout_id=rollout_id, listener=listener)
        self._states[rollout_id] = state
        self._counts[state.status] += 1
        return state

    def set_status(self, state: RolloutState, status: RolloutStatus) -> None:
        self._counts[state.status] -= 1
        self._counts[status] += 1
        state.status = status

    def bind_trial(self, rollout_id: str, trial_name: str, task_id: str) -> None:
        state = self._states[rollout_id]
        if state.trial_name and state.trial_name != trial_name:  # a retry on a fresh trial
            self._by_trial.pop(state.trial_name, None)
        state.trial_name, state.task_id = trial_name, task_id
        self._by_trial[trial_name] = rollout_id

    def finish(
        self,
        rollout_id: str,
        status: RolloutStatus,
        *,
        reward: float | None = None,
        error: str | None = None,
        err_category: str | None = None,
    ) -> None:
        state = self._states.get(rollout_id)
        if state is None:
            return
        self.set_status(state, status)
        state.reward, state.error, state.err_category = reward, error, err_category
        state.finished_at = time.time()
        self._finished.append((state.finished_at, rollout_id))
        state.task = None
        if state.trial_name:
            self._by_trial.pop(state.trial_name, None)

    def finish_with(self, rollout_id: str, outcome: ExecutionOutcome) -> ExecutionOutcome:
        """``finish`` from the outcome the rollout ends with (its status, reward and error)."""
        result = outcome.result
        self.finish(
            rollout_id,
            result.status,
            reward=result.sample.reward if result.sample is not None else None,
            error=result.err_message,
            err_category=result.err_category,
        )
        return outcome

    def _on_event(self, status: RolloutStatus):
        async def hook(event: TrialHookEvent) -> None:
            rollout_id = self._by_trial.get(event.trial_name)
            state = self._states.get(rollout_id) if rollout_id else None
            if state is None or state.status in TERMINAL:
                return
            self.set_status(state, status)
            if status is RolloutStatus.RUNNING:
                state.started_at = time.time()
            if state.listener is not None:
                await state.listener(status)

        return hook

    def _expire(self) -> None:
        cutoff = time.time() - self._retention_sec
        while self._finished and self._finished[0][0] < cutoff:
            finished_at, rid = self._finished.popleft()
            state = self._states.get(rid)
            if state is not None and state.finished_at == finished_at:
                del self._states[rid]
                self._counts[state.status] -= 1

    # ── queries ───────────────────────────────────────────────────────────────
    def get(self, rollout_id: str) -> RolloutState | None:
        return self._states.get(rollout_id)

    def status(self, rollout_id: str) -> dict[str, Any] | None:
        state = self._states.get(rollout_id)
        return state.public() if state else None

    def counts(self) -> dict[str, int]:
        active = (RolloutStatus.QUEUED, RolloutStatus.RUNNING, RolloutStatus.GRADING)
        counts = {s.value: self._counts[s] for s in active}
        counts["in_flight"] = sum(counts.values())
        return counts

    def queued(self) -> int:
        """Rollouts in ``execute()`` waiting for a trial slot (admission adds its held places)."""
        return self._counts[RolloutStatus.QUEUED]

    def in_flight(self) -> list[RolloutState]:
        return [s for s in self._states.values() if s.status not in TERMINAL]

    def select(self, ids: Sequence[str] | None, prefix: str | None, all: bool) -> list[str]:
        if all:
            return [s.rollout_id for s in self.in_flight()]
        if prefix is not None:
            return [s.rollout_id for s in self._states.values() if s.rollout_id.startswith(prefix)]
        return list(ids or [])
