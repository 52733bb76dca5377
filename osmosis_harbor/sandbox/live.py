"""Every sandbox this process creates, so that none outlives the work that made it.

Harbor's trials stop their environments, including on cancellation, but a cancellation
that lands while ``create`` is in flight can leave a sandbox nobody holds a handle to.
Environments register a sandbox name before creating it and the handle once they have
it; ``terminate_live_sandboxes`` ends whatever is still registered (by handle, or by name
through the SDK when the handle never arrived).
"""

from __future__ import annotations

import asyncio
import logging
import threading
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
