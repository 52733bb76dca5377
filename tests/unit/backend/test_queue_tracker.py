"""RolloutTracker bookkeeping (counts and retention without scanning) and admission's reservations
(through the real server: ``test_admission_places.py``)."""

from __future__ import annotations

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
