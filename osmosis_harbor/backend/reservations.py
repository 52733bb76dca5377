"""Admission's queue places: granted by ``has_capacity()``, claimed by ``execute()``.

The osmosis server asks ``has_capacity()`` and only later (after awaits of its own) starts the
rollout's task, whose ``execute()`` begins the rollout; without a place held in between, a burst
of POSTs would all see the same free capacity and overshoot ``max_queue_depth``. The server may
still refuse the request after asking (a duplicate id gets 409), so a place lives exactly as long
as the admission that took it, or the tasks that admission started until one of them claims it.

The server passes nothing from ``has_capacity()`` to ``execute()``; what links the two is the
task: ``has_capacity()`` runs in the admission's task, which starts the rollout's task (the
server's ``ROLLOUT_RUNNER`` coroutine). So a place remembers the tasks that existed when it was
granted; the rollout's ``execute()`` claims the place whose newcomer it runs in (usually still
within its admission: an uncontended start reaches ``execute()`` at once), and when the admission
ends unclaimed, the rollout runners it left waiting are its heirs. A refused admission leaves
none and its place goes at once; a place granted outside any task lapses after ``UNFOLLOWED_SEC``.
Were the server's runner renamed, an admitted rollout still on its way would lose its place as
its admission ends: a brief overshoot of ``max_queue_depth``, never a place held for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["ROLLOUT_RUNNER", "Reservation", "Reservations"]

# The coroutine osmosis_ai's rollout server (0.3.8: ``create_rollout_server``'s ``_run_rollout``)
# starts one task of per admitted rollout, which calls ``execute()``.
ROLLOUT_RUNNER = "_run_rollout"


@dataclass(eq=False)
class Reservation:
    """One admission's place in the queue, until the rollout it admitted claims it."""

    made_at: float
    admission: asyncio.Task[object] | None = None  # None: granted outside a task
    before: frozenset[asyncio.Task[object]] = frozenset()  # the tasks that were not the admission's
    heirs: set[asyncio.Task[object]] = field(default_factory=set)  # what the ended admission left running
    settled: bool = False  # its admission's end was handled (the task may be done before that)

    def belongs_to(self, task: asyncio.Task[object]) -> bool:
        """Whether ``task`` may be the rollout this place was granted for."""
        if task in self.heirs:
            return True
        unsettled = self.admission is not None and not self.settled
        return unsettled and task is not self.admission and task not in self.before


def _runs_rollout(task: asyncio.Task[object]) -> bool:
    return getattr(task.get_coro(), "__name__", None) == ROLLOUT_RUNNER


class Reservations:
    """The places admissions hold; with the rollouts already queued, what ``max_queue_depth`` bounds."""

    UNFOLLOWED_SEC = 10.0  # a place granted outside any task: there is no admission to follow

    def __init__(self, max_queue_depth: int | None, queued: Callable[[], int]) -> None:
        """``queued``: rollouts already in ``execute()`` and waiting for a trial slot."""
        self.max_queue_depth = max_queue_depth
        self._queued = queued
        self._held: dict[Reservation, None] = {}  # in the order granted

    def grant(self) -> Reservation | None:
        """A place for one more rollout, or None when ``max_queue_depth`` rollouts already queue."""
        if self.max_queue_depth is not None and self.queued() >= self.max_queue_depth:
            return None
        place = Reservation(time.monotonic())
        try:
            place.admission = asyncio.current_task()
        except RuntimeError:  # no event loop
            place.admission = None
        if place.admission is not None:
            place.before = frozenset(asyncio.all_tasks())
            place.admission.add_done_callback(lambda _task: self._admission_ended(place))
        self._held[place] = None
        return place

    def _admission_ended(self, place: Reservation) -> None:
        """Keep the place for the tasks its admission left running (none: it was refused)."""
        if place not in self._held:
            return
        place.settled = True
        place.heirs = {
            task for task in asyncio.all_tasks() if task not in place.before and not task.done() and _runs_rollout(task)
        }
        place.before = frozenset()
        if not place.heirs:
            del self._held[place]
        for heir in place.heirs:
            heir.add_done_callback(lambda task: self._heir_ended(place, task))

    def _heir_ended(self, place: Reservation, heir: asyncio.Task[object]) -> None:
        place.heirs.discard(heir)
        if not place.heirs:
            self._held.pop(place, None)

    def claim(self) -> Reservation | None:
        """The place of the rollout whose ``execute()`` starts now, in the current task (None:
        it was admitted without one, as a direct call of ``execute()`` is)."""
        try:
            current = asyncio.current_task()
        except RuntimeError:
            current = None
        place = next((p for p in self._held if current is not None and p.belongs_to(current)), None)
        if place is None:  # has_capacity() was asked outside a task: the oldest such place
            place = next((p for p in self._held if p.admission is None), None)
        if place is not None:
            del self._held[place]
            place.heirs.clear()
        return place

    def held(self) -> int:
        """Places granted and not yet claimed."""
        cutoff = time.monotonic() - self.UNFOLLOWED_SEC
        for place in [p for p in self._held if p.admission is None and p.made_at < cutoff]:
            del self._held[place]
        return len(self._held)

    def queued(self) -> int:
        """Rollouts waiting for a trial slot, plus admissions not yet in ``execute()``."""
        return self._queued() + self.held()
