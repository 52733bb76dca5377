"""Admission's queue places: granted by ``has_capacity()``, claimed by ``execute()``.

The osmosis server asks ``has_capacity()`` and only later (after awaits of its own) starts the
rollout's task, whose ``execute()`` begins the rollout; without a place held in between, a burst
of POSTs would all see the same free capacity and overshoot ``max_queue_depth``. The server may
still refuse the request after asking (a duplicate id gets 409), so a place lives as long as the
admission that took it, or the tasks that admission started, until the rollout claims it.

The server passes nothing from ``has_capacity()`` to ``execute()``, so the context carries the
place: ``has_capacity()`` runs in the admission's task and leaves its place there
(``owner.context.carry_admission_place``); the server then creates the rollout's task, which
copies that context, and its ``execute()`` claims exactly the place its own admission was granted
(``admission_place``). When the admission's task ends with its place unclaimed, the tasks still
running that carry the place are its heirs (the rollout's task on its way to ``execute()``, and
what the server started beside it for that rollout: its result lease, its preview, none of which
outlives the rollout's result); the place is held until one claims it or all of them end. A
refused admission started none, so its place goes as it ends. A place granted outside any task
has no admission to follow: it lapses after ``UNFOLLOWED_SEC``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from osmosis_harbor.sandbox.owner.context import admission_place, carry_admission_place

__all__ = ["Reservation", "Reservations"]


@dataclass(eq=False)
class Reservation:
    """One admission's place in the queue, until the rollout it admitted claims it."""

    made_at: float
    followed: bool  # granted in a task: the task (then its heirs) holds it, not a lapse
    heirs: set[asyncio.Task[Any]] = field(default_factory=set)  # what the ended admission left running


class Reservations:
    """The places admissions hold; with the rollouts already queued, what ``max_queue_depth`` bounds."""

    UNFOLLOWED_SEC = 10.0  # a place granted outside any task: there is no admission to follow

    def __init__(self, max_queue_depth: int | None, queued: Callable[[], int]) -> None:
        """``queued``: rollouts already in ``execute()`` and waiting for a trial slot."""
        self.max_queue_depth = max_queue_depth
        self._queued = queued
        self._held: dict[Reservation, None] = {}

    def grant(self) -> Reservation | None:
        """A place for one more rollout, or None when ``max_queue_depth`` rollouts already queue."""
        if self.max_queue_depth is not None and self.queued() >= self.max_queue_depth:
            return None
        try:
            admission = asyncio.current_task()
        except RuntimeError:  # no event loop
            admission = None
        place = Reservation(time.monotonic(), followed=admission is not None)
        self._held[place] = None
        carry_admission_place(place)
        if admission is not None:
            admission.add_done_callback(lambda _task: self._admission_ended(place))
        return place

    def _admission_ended(self, place: Reservation) -> None:
        """Keep the place for the tasks its admission left running with it (none: it was refused)."""
        if place not in self._held:
            return
        place.heirs = {task for task in asyncio.all_tasks() if not task.done() and admission_place(task) is place}
        if not place.heirs:
            del self._held[place]
        for heir in place.heirs:
            heir.add_done_callback(lambda task: self._heir_ended(place, task))

    def _heir_ended(self, place: Reservation, heir: asyncio.Task[Any]) -> None:
        place.heirs.discard(heir)
        if not place.heirs:
            self._held.pop(place, None)

    def claim(self) -> Reservation | None:
        """The place of the rollout whose ``execute()`` starts here (None: it was admitted without
        one, as a direct call of ``execute()`` is, or its place already went)."""
        place = admission_place()
        if not isinstance(place, Reservation) or place not in self._held:
            return None
        del self._held[place]
        place.heirs.clear()
        return place

    def held(self) -> int:
        """Places granted and not yet claimed."""
        cutoff = time.monotonic() - self.UNFOLLOWED_SEC
        for place in [p for p in self._held if not p.followed and p.made_at < cutoff]:
            del self._held[place]
        return len(self._held)

    def queued(self) -> int:
        """Rollouts waiting for a trial slot, plus admissions not yet in ``execute()``."""
        return self._queued() + self.held()
