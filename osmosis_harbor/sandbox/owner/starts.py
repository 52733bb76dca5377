"""A bound on sandboxes being created or claimed at once, owned by whoever starts trials.

Trial concurrency bounds how many trials run; it does not bound how many sandboxes *start* at
once, and a burst of trials starting together can exhaust a provider's create rate (one Modal
campaign had to cap starts at 128). ``SandboxStarts`` is that second bound. It belongs to an
owner (``context.SandboxOwner``: a backend, a run), never to the process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

from osmosis_harbor.sandbox.owner.batching import ClaimBatcher

__all__ = ["SandboxStarts"]


class SandboxStarts:
    """At most ``limit`` sandbox creates or claims in flight at once; with a batch window,
    pool claims made within it go out together (``batching.ClaimBatcher``)."""

    def __init__(self, limit: int, *, batch_window_sec: float = 0.0, batch_max: int = 0) -> None:
        if limit < 1:
            raise ValueError(f"max_concurrent_starts must be >= 1, got {limit}")
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit)
        self.in_flight = 0
        self.waiting = 0
        self.claims: Counter[str] = Counter()  # pool claims made, per pool (autoscaling reads it)
        self.fallbacks: Counter[str] = Counter()  # claims the pool could not serve: cold-created instead
        self.batches = (
            ClaimBatcher(batch_window_sec, batch_max, self.slot) if batch_window_sec > 0 and batch_max >= 2 else None
        )

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one start slot for the block (one create or claim call)."""
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._semaphore.release()

    def note_claim(self, pool: str, *, fell_back: bool = False) -> None:
        """A claim of ``pool``; ``fell_back``: the pool could not serve it, so it was cold-created
        (it still counts as demand on the pool, which the autoscaler sizes for)."""
        self.claims[pool] += 1
        if fell_back:
            self.fallbacks[pool] += 1

    def state(self) -> dict[str, int]:
        """What ``health()`` shows."""
        return {
            "max_concurrent_starts": self.limit,
            "starting": self.in_flight,
            "waiting_to_start": self.waiting,
            "batch_claims": self.batches.calls if self.batches is not None else 0,
            "pool_fallbacks": sum(self.fallbacks.values()),
        }
