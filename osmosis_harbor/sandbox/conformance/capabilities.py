"""The capability set of an SDK under test: what it offers beyond the common surface.

Read from the SDK itself and from its registration (`registry.SandboxImplementation`), never
from a table keyed by SDK name: the archive capability from a live sandbox handle
(`protocol.has_archives`, the same test the environment makes before it uses archives), the
registration's boolean fields as they are (whatever flags an implementation is registered
with), and the optional calls from the SDK module. A check that is about a capability the SDK
definitely lacks is reported as not applicable, apart from passes and skips.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from pydantic import BaseModel

from osmosis_harbor.sandbox.sdk.protocol import has_archives
from osmosis_harbor.sandbox.sdk.registry import implementation, name_of

__all__ = ["POOL_CALLS", "Capabilities", "probe"]

# The warm-pool calls the environment and prewarm make (SkyPilot's documented pool surface).
POOL_CALLS = ("create_pool", "set_pool_size", "delete_pool")


class Capabilities(BaseModel):
    """Each capability: True (offered), False (definitely not), None (could not tell: ``notes``)."""

    sdk: str | None
    offered: dict[str, bool | None]
    notes: dict[str, str] = {}

    def lacks(self, name: str) -> bool:
        """Definitely not offered (an unknown capability is not counted as missing)."""
        return self.offered.get(name, None) is False

    def describe(self) -> str:
        words = {True: "yes", False: "no", None: "unknown"}
        return ", ".join(f"{name} {words[value]}" for name, value in self.offered.items())


def _has_aio(obj: Any, name: str) -> bool:
    return callable(getattr(getattr(obj, name, None), "aio", None))


def _accepts(call: Any, parameter: str) -> bool | None:
    """Whether ``call`` takes ``parameter`` by name (None: it takes ``**kwargs``, so unknown)."""
    try:
        params = inspect.signature(call).parameters
    except (TypeError, ValueError):
        return None
    if parameter in params:
        return True
    return None if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) else False


def _registration_flags(sdk: Any) -> tuple[str | None, dict[str, bool]]:
    name = name_of(sdk)
    if name is None:
        return None, {}
    impl = implementation(name)
    flags = {f.name: getattr(impl, f.name) for f in dataclasses.fields(impl)}
    return name, {key: value for key, value in flags.items() if isinstance(value, bool)}


def probe(sdk: Any, handle: Any | None, *, handle_error: str | None = None) -> Capabilities:
    """The capability set of ``sdk``; ``handle`` is one of its live sandboxes (None when none
    could be created: the per-handle capabilities are then unknown, with ``handle_error``)."""
    name, flags = _registration_flags(sdk)
    offered: dict[str, bool | None] = {}
    notes: dict[str, str] = {}
    offered["archives"] = has_archives(handle) if handle is not None else None
    offered.update(flags)
    offered["pools"] = all(_has_aio(sdk, call) for call in POOL_CALLS)
    offered["pool_view"] = _has_aio(sdk, "get_pool")  # beyond SkyPilot's SDK: the Docker SDK's
    offered["num_sandboxes"] = _accepts(getattr(sdk, "create", None), "num_sandboxes")
    offered["ls"] = _has_aio(sdk, "ls")
    offered["snapshot"] = _has_aio(handle, "snapshot") if handle is not None else None
    if handle is None:
        notes["archives"] = notes["snapshot"] = f"no sandbox to ask: {handle_error or 'none created'}"
    if offered["num_sandboxes"] is None:
        notes["num_sandboxes"] = "create takes **kwargs: cannot tell without calling it"
    return Capabilities(sdk=name, offered=offered, notes=notes)
