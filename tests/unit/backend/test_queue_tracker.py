"""RolloutTracker bookkeeping: counts, reservations and retention without scanning."""

from __future__ import annotations

import time

from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

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
    tracker.reserve()
    tracker.reserve()
    assert tracker.queued() == 2
    tracker.admit("a")  # claims one reservation, adds one queued state
    assert tracker.queued() == 2
    now = time.monotonic() + RolloutTracker.RESERVATION_TTL_SEC + 1
    monkeypatch.setattr(time, "monotonic", lambda: now)
    assert tracker.queued() == 1  # the unclaimed reservation lapsed
