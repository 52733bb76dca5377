"""The sandboxes a backend (or a validation run) has created and not yet seen terminated.

Harbor's trials stop their environments, including on cancellation, but a cancellation that
lands while ``create`` is in flight can leave a sandbox nobody holds a handle to, and a
terminate can fail. So every sandbox is registered, and written to the crash-safe ``ledger``,
before its create call; it leaves both only once its terminate succeeded (or ``ls`` showed a
failed create made nothing). A terminate that fails is retried in the background with backoff,
and again by ``terminate_all`` (the owner's shutdown sweep); what even that cannot remove stays
in the ledger, for the next start or ``cleanup`` to reap once this process is gone.

A registry belongs to its owner (``context.SandboxOwner``: a backend, a validation run, a
command), never to the process: one backend's shutdown never touches another's sandboxes. Its
pools are recorded with their users (``Ledger.use_pool``): pool names are shared warm capacity,
so a shutdown deletes a pool only when no other live owner uses it (``pools.delete``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from osmosis_harbor import settings
from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox.ledger.store import Kind, Ledger, State, default_ledger, endpoint_for
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, retry_safe, terminate_by_name, terminate_record
from osmosis_harbor.sandbox.sdk.liveness import sandbox_state
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk

__all__ = ["OwnedSandboxes"]

logger = logging.getLogger(__name__)

# Background retries of a failed terminate (each one itself retried on API faults).
BACKGROUND_ATTEMPTS = 6
BACKGROUND_MAX_WAIT_SEC = 60.0


@dataclass
class _Live:
    sdk: SandboxSdk
    sdk_name: str
    endpoint: str
    handle: Any | None = None
    retrying: asyncio.Task[None] | None = None


class _StillThere(Exception):
    """A background terminate attempt failed (tenacity retries on this)."""


class OwnedSandboxes:
    """One owner's sandboxes and pools, mirrored in the ledger until the SDK said they are gone.

    ``user`` names the owner among the pool's users (unique per owner, so two backends of one
    process are two users); ``process`` is the owner's process, by which a reaper judges it.
    ``config``: the owner's settings, read once by its maker; they give the
    ledger (unless ``ledger`` is given), each SDK's endpoint and the retries of its calls."""

    def __init__(self, ledger: Ledger | None = None, *, config: settings.Settings, user: str | None = None) -> None:
        self.config = config
        self.retry = ApiRetry.of(self.config)
        self._ledger = ledger
        self._live: dict[str, _Live] = {}
        self._pools: dict[str, str] = {}  # pool name -> SDK name, while this owner holds it
        self._guard = threading.Lock()
        self.process = OwnerProcess.current()
        self.user = user or uuid.uuid4().hex

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = default_ledger(self.config)
        return self._ledger

    def _endpoint(self, sdk_name: str) -> str:
        return endpoint_for(sdk_name, self.config)

    def names(self) -> list[str]:
        with self._guard:
            return sorted(self._live)

    def registered(self, name: str) -> bool:
        """Whether a sandbox of that name is being created, runs, or failed to terminate."""
        with self._guard:
            return name in self._live

    async def pending(self, name: str, sdk: SandboxSdk, sdk_name: str) -> None:
        """Before the create call: in the ledger first, then in memory."""
        endpoint = self._endpoint(sdk_name)
        await asyncio.to_thread(self.ledger.record, Kind.SANDBOX, sdk_name, endpoint, name, self.process)
        with self._guard:
            self._live[name] = _Live(sdk=sdk, sdk_name=sdk_name, endpoint=endpoint)

    async def rename(self, old: str, new: str) -> None:
        """The sandbox created as ``old`` goes by ``new`` (a batch claim's member name)."""
        with self._guard:
            live = self._live.pop(old, None)
        if live is None:
            return
        await asyncio.to_thread(self.ledger.record, Kind.SANDBOX, live.sdk_name, live.endpoint, new, self.process)
        await asyncio.to_thread(self.ledger.forget, Kind.SANDBOX, live.sdk_name, live.endpoint, old)
        with self._guard:
            self._live[new] = live

    async def attach(self, name: str, handle: Any) -> None:
        with self._guard:
            live = self._live.get(name)
            if live is not None:
                live.handle = handle
        if live is not None:
            await asyncio.to_thread(self.ledger.mark, Kind.SANDBOX, live.sdk_name, live.endpoint, name, State.RUNNING)

    async def _forget(self, name: str, live: _Live) -> None:
        await asyncio.to_thread(self.ledger.forget, Kind.SANDBOX, live.sdk_name, live.endpoint, name)
        with self._guard:
            if self._live.get(name) is live:
                del self._live[name]

    async def _terminate_once(self, name: str, live: _Live) -> str | None:
        """One terminate (retried on API faults); the error, or None once it is gone."""
        try:
            if live.handle is not None:
                await retry_safe("terminate", self.retry, live.handle.terminate.aio, wait=True)
            else:
                await terminate_by_name(live.sdk, name, self.retry)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            await asyncio.to_thread(
                self.ledger.mark, Kind.SANDBOX, live.sdk_name, live.endpoint, name, State.TERMINATE_FAILED, message
            )
            return message
        await self._forget(name, live)
        return None

    async def end(self, name: str) -> bool:
        """Terminate ``name``; on failure it stays registered and in the ledger, and a background
        task keeps trying. Returns whether it is gone."""
        with self._guard:
            live = self._live.get(name)
        if live is None:
            return True
        error = await self._terminate_once(name, live)
        if error is None:
            return True
        logger.warning("could not terminate sandbox %s (%s): retrying in the background", name, error)
        if live.retrying is None or live.retrying.done():
            live.retrying = asyncio.get_running_loop().create_task(self._keep_trying(name, live))
        return False

    async def _keep_trying(self, name: str, live: _Live) -> None:
        async def attempt() -> None:
            if await self._terminate_once(name, live) is not None:
                raise _StillThere(name)

        try:
            await AsyncRetrying(
                retry=retry_if_exception_type(_StillThere),
                stop=stop_after_attempt(BACKGROUND_ATTEMPTS),
                wait=wait_random_exponential(multiplier=1, max=BACKGROUND_MAX_WAIT_SEC),
                reraise=True,
            )(attempt)
        except _StillThere:
            logger.error("sandbox %s still not terminated: left to the shutdown sweep and the ledger", name)

    async def settle_failed_create(self, name: str) -> None:
        """A create that failed may still have made the sandbox (an API fault, a cancellation):
        ``ls`` decides whether there is something to terminate."""
        with self._guard:
            live = self._live.get(name)
        if live is None or live.handle is not None:
            if live is not None:
                await self.end(name)
            return
        try:
            state = await retry_safe("ls", self.retry, sandbox_state, live.sdk, name)
        except Exception as exc:  # cannot tell: try to terminate it, keep it if that fails
            logger.warning("cannot list sandboxes after a failed create of %s: %s", name, exc)
            await self.end(name)
            return
        if state.status is None:
            await self._forget(name, live)
        else:
            await self.end(name)

    # ── warm pools: recorded like sandboxes, deleted at the owner's shutdown ──────────────
    async def pool_pending(self, name: str, sdk_name: str) -> None:
        """Before ``create_pool``: a pool this owner makes or adopts, and uses (it deletes it,
        unless another live owner uses it too, or hands it over)."""
        endpoint = self._endpoint(sdk_name)
        await asyncio.to_thread(self.ledger.use_pool, sdk_name, endpoint, name, self.user, self.process)
        await asyncio.to_thread(self.ledger.record, Kind.POOL, sdk_name, endpoint, name, self.process)
        with self._guard:
            self._pools[name] = sdk_name

    async def pool_shared(self, name: str, sdk_name: str) -> bool:
        """Whether another live owner uses ``name``; if so this owner lets go of it (its use
        released, the pool left to the last user: the ledger keeps it, for that user or a reaper)."""
        endpoint = self._endpoint(sdk_name)
        others = await asyncio.to_thread(self.ledger.live_pool_users, sdk_name, endpoint, name, besides=self.user)
        if not others:
            return False
        await asyncio.to_thread(self.ledger.release_pool, sdk_name, endpoint, name, self.user)
        with self._guard:
            self._pools.pop(name, None)
        return True

    async def pool_made(self, name: str, sdk_name: str) -> None:
        await asyncio.to_thread(self.ledger.mark, Kind.POOL, sdk_name, self._endpoint(sdk_name), name, State.RUNNING)

    async def pool_gone(self, name: str, sdk_name: str) -> None:
        endpoint = self._endpoint(sdk_name)
        await asyncio.to_thread(self.ledger.forget, Kind.POOL, sdk_name, endpoint, name)
        await asyncio.to_thread(self.ledger.release_pool, sdk_name, endpoint, name, self.user)
        with self._guard:
            self._pools.pop(name, None)

    async def pool_delete_failed(self, name: str, sdk_name: str, error: str) -> None:
        """The pool stays in the ledger, with why, for the next start or ``cleanup`` to delete."""
        endpoint = self._endpoint(sdk_name)
        await asyncio.to_thread(self.ledger.mark, Kind.POOL, sdk_name, endpoint, name, State.DELETE_FAILED, error)

    async def end_if_ours(self, sdk: SandboxSdk, sdk_name: str, record: Any) -> bool:
        """Terminate the listed sandbox ``record`` if it is this owner's, or a dead owner's by the
        ledger (a pool's members before the pool goes); a live owner's, or one the ledger does
        not know, is left alone. Returns whether it was ended."""
        name = records.name_of(record)
        if name is None:
            return False
        if self.registered(name):
            return await self.end(name)
        endpoint = self._endpoint(sdk_name)
        entries = await asyncio.to_thread(self.ledger.entries, sdk_name, endpoint)
        entry = next((e for e in entries if e.kind is Kind.SANDBOX and e.name == name), None)
        if entry is None or not (entry.owner == self.process or entry.owner.is_dead()):
            return False
        await terminate_record(sdk, record, self.retry)
        await asyncio.to_thread(self.ledger.forget, Kind.SANDBOX, sdk_name, endpoint, name)
        return True

    def release_pools(self) -> list[str]:
        """Hand this owner's pools over to the user (``prewarm``'s pools outlive the command by
        design): marked handed over in the ledger, so no reaper deletes them when this process is
        gone and ``cleanup --pool`` finds them on an SDK that cannot list pools."""
        with self._guard:
            pools, self._pools = dict(self._pools), {}
        for name, sdk_name in pools.items():
            self.ledger.mark(Kind.POOL, sdk_name, self._endpoint(sdk_name), name, State.HANDED_OVER)
            self.ledger.release_pool(sdk_name, self._endpoint(sdk_name), name, self.user)
        return sorted(pools)

    async def terminate_all(self) -> list[str]:
        """The shutdown sweep: every registered sandbox, failed terminations included. Returns
        what could not be removed (it stays in the ledger, for the next start or ``cleanup``)."""
        with self._guard:
            items = list(self._live.items())
        for _, live in items:
            if live.retrying is not None:
                live.retrying.cancel()
        errors = await asyncio.gather(*(self._terminate_once(name, live) for name, live in items))
        failures = [f"{name}: {error}" for (name, _), error in zip(items, errors, strict=True) if error]
        for failure in failures:
            logger.warning("could not terminate sandbox %s (it stays in the ledger)", failure)
        return failures
