"""The order in which one backend's rollouts reach Harbor's ``TrialQueue``: infra retries first.

Harbor's queue has no priority: ``submit()`` returns a coroutine that waits on a semaphore, so
a rollout retried after a lost sandbox would wait behind every rollout admitted meanwhile (our
soak's retries waited minutes). ``TrialGate`` stands in front of ``submit`` with as many slots
as the queue runs trials at once: a rollout submits only while it holds a slot, so the queue's
own semaphore never has anyone waiting and the gate alone decides who runs next. A retry goes
ahead of every rollout that has not started; among equals, admission order (the ticket a rollout
drew when it first reached the gate) decides, so a retry keeps its admission place.

A queue shared with work that does not pass through this gate (another backend, a validation
run) still bounds concurrency, but the order among those is Harbor's again.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from enum import IntEnum

__all__ = ["Lease", "Priority", "TrialGate"]


class Priority(IntEnum):
    """Lower runs first."""

    RETRY = 0
    FIRST_ATTEMPT = 1


class TrialGate:
    """Slots of the queue's concurrency, granted by (priority, admission ticket)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a trial gate needs at least one slot, got {capacity}")
        self.capacity = capacity
        self._free = capacity
        self._tickets = itertools.count()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []

    def lease(self) -> Lease:
        """A rollout's place in line, drawn when it first reaches the gate."""
        return Lease(self, next(self._tickets))

    @property
    def waiting(self) -> int:
        """Rollouts waiting for a slot (health, and tests that wait for a queue to form)."""
        return sum(1 for *_, future in self._waiters if not future.done())

    @property
    def holding(self) -> int:
        return self.capacity - self._free

    def _enqueue(self, priority: Priority, ticket: int) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (int(priority), ticket, future))
        self._grant()
        return future

    def _release(self) -> None:
        self._free += 1
        self._grant()

    def _grant(self) -> None:
        while self._free and self._waiters:
            *_, future = heapq.heappop(self._waiters)
            if future.done():  # its waiter was cancelled: the slot goes to the next one
                continue
            future.set_result(None)
            self._free -= 1


class Lease:
    """One rollout's slot in a ``TrialGate``, held across its attempts.

    ``acquire`` waits for a slot (a no-op while one is held); ``requeue`` gives the slot back
    while queueing again as a retry, so the retry is first in line for the very slot it frees;
    ``release`` ends the lease whatever state it is in (idempotent)."""

    def __init__(self, gate: TrialGate, ticket: int) -> None:
        self._gate = gate
        self.ticket = ticket
        self._waiter: asyncio.Future[None] | None = None

    @property
    def holding(self) -> bool:
        waiter = self._waiter
        return waiter is not None and waiter.done() and not waiter.cancelled()

    async def acquire(self, priority: Priority = Priority.FIRST_ATTEMPT) -> None:
        if self._waiter is None:
            self._waiter = self._gate._enqueue(priority, self.ticket)
        # Cancelled while waiting: the future is cancelled too and the gate skips it; cancelled
        # just after the grant: the slot stays on the lease until release().
        await self._waiter

    def requeue(self) -> None:
        """Give the slot back and wait for the next one at retry priority (``acquire`` awaits it)."""
        held = self.holding
        self._waiter = self._gate._enqueue(Priority.RETRY, self.ticket)
        if held:
            self._gate._release()

    def release(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        if waiter.done() and not waiter.cancelled():
            self._gate._release()
        else:
            waiter.cancel()
