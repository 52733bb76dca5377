"""RolloutTracker bookkeeping (counts and retention without scanning) and admission's reservations."""

from __future__ import annotations

import asyncio
import time

from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend.reservations import Reservations
from osmosis_harbor.backend.tracker import RolloutTracker


def test_counts_follow_transitions_and_retention_expires_finished_states(monkeypatch) -> None:
    tracker = RolloutTracker(TrialQueue(n_concurrent=1), retention_sec=60)
    for i in range(3):
        tracker.admit(f"r{i}")
    assert tracker.counts() == {"queued": 3, "running": 0, "grading": 0, "in_flight": 3}
    tracker.set_status(tracker.get("r0"), RolloutStatus.RUNNING)
    tracker.finish("r1", RolloutStatus.SUCCESS, reward=1.0)
    assert tracker.counts() == {"queued": 1, "running": 1, "grading": 0, "in_flight": 2}
    assert tracker.status("r1")["reward"] == 1.0 and tracker.select(None, None, True) == ["r0", "r2"]
    later = time.time() + 120
    monkeypatch.setattr(time, "time", lambda: later)
    tracker.admit("r3")  # admission expires retained terminal states
    assert tracker.status("r1") is None and tracker.counts()["in_flight"] == 3


def test_reservations_count_as_queued_until_claimed_or_lapsed(monkeypatch) -> None:
    tracker = RolloutTracker(TrialQueue(n_concurrent=1))
    reservations = Reservations(3, tracker.queued)
    assert reservations.grant() is not None and reservations.grant() is not None
    assert reservations.queued() == 2
    assert reservations.claim() is not None  # an execute() starting claims one place...
    tracker.admit("a")  # ...and its rollout queues instead
    assert reservations.queued() == 2
    assert reservations.grant() is not None and reservations.grant() is None  # max_queue_depth=3 reached
    now = time.monotonic() + Reservations.UNFOLLOWED_SEC + 1
    monkeypatch.setattr(time, "monotonic", lambda: now)
    assert reservations.queued() == 1  # places granted outside a task, never claimed, lapsed


async def test_a_refused_admission_gives_its_place_back_and_an_accepted_one_keeps_it() -> None:
    """The server may refuse a request after has_capacity() said yes (a duplicate id): the place
    goes with the admission that failed; an admission that succeeded keeps its place for the
    rollout task it started, whose execute() claims it, even after the admission ended."""
    reservations = Reservations(None, lambda: 0)
    claimed: list[object] = []
    go = asyncio.Event()

    async def _run_rollout() -> None:  # named as the server's runner (ROLLOUT_RUNNER)
        await go.wait()  # the server's own awaits before execute()
        claimed.append(reservations.claim())

    async def bystander() -> None:  # a task the admission did not start for a rollout
        await go.wait()

    async def admission(refuse: bool) -> asyncio.Task[None] | None:
        assert reservations.grant() is not None
        asyncio.ensure_future(bystander())
        return None if refuse else asyncio.ensure_future(_run_rollout())

    await asyncio.ensure_future(admission(True))
    await asyncio.sleep(0)  # the admission's done callbacks run on the next turn of the loop
    assert reservations.held() == 0  # refused: no rollout left to claim the place, whatever else runs
    started = await asyncio.ensure_future(admission(False))
    await asyncio.sleep(0)
    assert reservations.held() == 1  # kept for the rollout it started
    assert reservations.claim() is None  # not this task's place: a direct execute() holds none
    go.set()
    await started
    assert claimed[0] is not None and reservations.held() == 0
