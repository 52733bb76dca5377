"""Batch claims: trials of one pool group that start within a short window claim in one call.

A training step starts hundreds of trials of the same task at once; claiming their pool
members one call each costs a control-plane round trip per trial. ``ClaimBatcher`` gathers the
claims of one pool (with identical create arguments) made within ``window_sec`` of the first,
or until ``max_size`` joined, and makes one ``create(pool=, num_sandboxes=k, name=<prefix>)``
call; each trial gets one member of the returned list, in arrival order.

Names. Our environments name a sandbox after its trial (``hb-<session>``). SkyPilot's SDK names
the members of a multi-sandbox create from the given prefix, so a batch of k >= 2 is claimed
under a fresh prefix ``hb-batch-<8 hex>`` (members ``<prefix>-<i>``), and each environment
adopts its member's name for the rest of the trial (liveness checks, termination). A batch of
one is an ordinary claim under the trial's own name. A member whose trial was cancelled while
the batch was in flight is terminated at once, so no claimed sandbox outlives its trial.

One batch call takes one slot of the owner's start bound (``starts.SandboxStarts``): it is one
call to the provider, whatever its size.

A batch the pool cannot serve whole (SkyPilot's claims need ready members; the call is all or
nothing) is split in halves, each claimed again, down to lone claims, whose refusal reaches the
trial's claim (``pools.claim``: it waits, then cold-creates). A batch call that failed with an
API fault may have made members all the same: they are found by the batch's prefix in ``ls``
and terminated before the claims fail, so a retry never leaves the first call's members behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.errors import is_api_fault, is_missing
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, retry_safe, terminate_record
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk

__all__ = ["BATCH_PREFIX", "ClaimBatcher"]

log = logging.getLogger(__name__)

BATCH_PREFIX = "hb-batch-"


@dataclass
class _Batch:
    sdk: SandboxSdk
    pool: str
    common: dict[str, Any]
    retry: ApiRetry  # the first claim's: how a faulted batch call's leftovers are found
    waiters: list[tuple[str, asyncio.Future[Any]]] = field(default_factory=list)
    full: asyncio.Event = field(default_factory=asyncio.Event)


class ClaimBatcher:
    """Gathers one owner's pool claims into batch calls."""

    def __init__(
        self,
        window_sec: float,
        max_size: int,
        slot: Callable[[], contextlib.AbstractAsyncContextManager[None]],
    ) -> None:
        if window_sec <= 0 or max_size < 2:
            raise ValueError("a claim batcher needs a positive window and room for at least two claims")
        self.window_sec = window_sec
        self.max_size = max_size
        self._slot = slot
        self._open: dict[tuple[int, str, str], _Batch] = {}
        self._runs: set[asyncio.Task[None]] = set()
        self.calls = 0  # batch calls made (k >= 2), for health and tests

    async def claim(self, sdk: SandboxSdk, pool: str, name: str, common: dict[str, Any], retry: ApiRetry) -> Any:
        """One member of ``pool`` for the sandbox that would have been called ``name``."""
        key = (id(sdk), pool, repr(sorted(common.items())))
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch(sdk, pool, common, retry)
            run = asyncio.ensure_future(self._run(key, batch))
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch.waiters.append((name, future))
        if len(batch.waiters) >= self.max_size:
            batch.full.set()
        return await future  # cancelled: the run terminates the member it brings

    async def _run(self, key: tuple[int, str, str], batch: _Batch) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(batch.full.wait(), self.window_sec)
        if self._open.get(key) is batch:
            del self._open[key]
        await self._serve(batch, list(batch.waiters))

    async def _serve(self, batch: _Batch, waiters: list[tuple[str, asyncio.Future[Any]]]) -> None:
        """One call for ``waiters``; a refused batch of several is split (see the module docstring)."""
        try:
            async with self._slot():
                members = await self._create(batch, [name for name, _ in waiters])
        except Exception as exc:
            if len(waiters) > 1 and not is_api_fault(exc) and not is_missing(exc):
                log.info("pool %s could not serve %d claims at once (%s): splitting", batch.pool, len(waiters), exc)
                half = len(waiters) // 2
                await asyncio.gather(self._serve(batch, waiters[:half]), self._serve(batch, waiters[half:]))
                return
            for _, future in waiters:  # every claim of the batch fails as the one call did
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for _, future in waiters:
                future.cancel()
            raise
        orphans = []
        for (_, future), member in zip(waiters, members, strict=True):
            if future.done():  # its trial was cancelled meanwhile
                orphans.append(member)
            else:
                future.set_result(member)
        for member in orphans:
            with contextlib.suppress(Exception):
                await member.terminate.aio(wait=True)

    async def _create(self, batch: _Batch, names: list[str]) -> list[Any]:
        if len(names) == 1:
            return [await batch.sdk.create.aio(pool=batch.pool, name=names[0], **batch.common)]
        self.calls += 1
        prefix = f"{BATCH_PREFIX}{uuid.uuid4().hex[:8]}"
        try:
            # The protocol types create() as one handle; with num_sandboxes it returns a list.
            made: Any = await batch.sdk.create.aio(
                pool=batch.pool, num_sandboxes=len(names), name=prefix, **batch.common
            )
        except Exception as exc:
            if is_api_fault(exc):
                await self._settle(batch.sdk, prefix, batch.retry)
            raise
        members = list(made)
        if len(members) != len(names):
            for member in members:
                with contextlib.suppress(Exception):
                    await member.terminate.aio(wait=True)
            raise RuntimeError(f"pool {batch.pool!r} returned {len(members)} sandboxes for {len(names)} claims")
        return members

    @staticmethod
    async def _settle(sdk: SandboxSdk, prefix: str, retry: ApiRetry) -> None:
        """Terminate what a faulted batch call made (its members share ``prefix``)."""
        try:
            listed = await retry_safe("ls", retry, sdk.ls.aio)
        except Exception as exc:  # cannot tell: their TTL and the ledger's reap remain
            log.warning("cannot list sandboxes after a failed batch claim %s: %s", prefix, exc)
            return
        for record in listed:
            if (records.name_of(record) or "").startswith(f"{prefix}-"):
                with contextlib.suppress(Exception):
                    await terminate_record(sdk, record, retry)
