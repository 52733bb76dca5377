"""Every sandbox this process creates, so that none outlives the work that made it.

Harbor's trials stop their environments, including on cancellation, but a cancellation
that lands while ``create`` is in flight can leave a sandbox nobody holds a handle to.
Environments register a sandbox name before creating it and the handle once they have
it; ``terminate_live_sandboxes`` ends whatever is still registered (by handle, or by name
through the SDK when the handle never arrived).

Terminations can also leave a trial's critical path (``termination_scope``): inside a scope
an environment's stop hands its ``terminate(wait=True)`` to a task and returns, so the
queue slot frees and a separate verifier starts while the agent's sandbox goes away; whoever
opened the scope awaits the tasks (``settle``) before reporting the result, so no rollout
ends with its sandbox still there. A sandbox stays registered until its termination ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from osmosis_harbor.sandbox.protocol import SandboxSdk

logger = logging.getLogger(__name__)


@dataclass
class _Live:
    sdk: SandboxSdk
    handle: Any | None = None


_LIVE: dict[str, _Live] = {}
_GUARD = threading.Lock()


_SCOPE: contextvars.ContextVar[list[asyncio.Task[None]] | None] = contextvars.ContextVar(
    "osmosis_harbor_termination_scope", default=None
)


@contextlib.contextmanager
def termination_scope() -> Iterator[list[asyncio.Task[None]]]:
    """Let the stops of environments started in this context (and the tasks it spawns)
    terminate in the background; the caller must ``settle`` the returned tasks."""
    pending: list[asyncio.Task[None]] = []
    token = _SCOPE.set(pending)
    try:
        yield pending
    finally:
        _SCOPE.reset(token)


def defer_termination(name: str, termination: Callable[[], Coroutine[Any, Any, None]]) -> bool:
    """Run ``termination()`` in the background when a scope is open (False: run it yourself).
    The sandbox stays registered until it ends."""
    pending = _SCOPE.get()
    if pending is None:
        return False

    async def run() -> None:
        try:
            await termination()
        finally:
            unregister(name)

    pending.append(asyncio.ensure_future(run()))
    return True


async def settle(pending: list[asyncio.Task[None]]) -> None:
    """Wait for deferred terminations, even if the waiter is cancelled meanwhile."""
    while pending:
        batch = list(pending)
        pending.clear()
        gathered = asyncio.gather(*batch, return_exceptions=True)
        try:
            await asyncio.shield(gathered)
        except asyncio.CancelledError:
            await gathered
            raise


def register_pending(name: str, sdk: SandboxSdk) -> None:
    with _GUARD:
        _LIVE[name] = _Live(sdk=sdk)


def registered(name: str) -> bool:
    """Whether a sandbox of that name is being created or runs (and is not yet stopped)."""
    with _GUARD:
        return name in _LIVE


def register_handle(name: str, handle: Any) -> None:
    with _GUARD:
        if name in _LIVE:
            _LIVE[name].handle = handle


def unregister(name: str) -> None:
    with _GUARD:
        _LIVE.pop(name, None)


async def _terminate(name: str, live: _Live) -> str | None:
    try:
        if live.handle is not None:
            await live.handle.terminate.aio(wait=True)
        else:
            by_name = getattr(live.sdk, "terminate_by_name", None)
            if by_name is not None:
                await by_name.aio(name)
        return None
    except Exception as exc:  # report, keep going: one failure must not leak the rest
        return f"{name}: {exc}"


async def terminate_live_sandboxes() -> list[str]:
    """Terminate every registered sandbox; returns the ones that could not be removed."""
    with _GUARD:
        items = list(_LIVE.items())
        _LIVE.clear()
    if not items:
        return []
    errors = await asyncio.gather(*(_terminate(name, live) for name, live in items))
    failures = [e for e in errors if e]
    for failure in failures:
        logger.warning("could not terminate sandbox %s", failure)
    return failures
