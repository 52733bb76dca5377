"""The emulator server's calls beyond SkyPilot's documented SDK: pool views, terminate by name.

SkyPilot shows pools and sandboxes in its dashboard, not through its SDK, so the SDK facade
(``osmosis_harbor.sandbox.emulator``) does not offer these: code written against it cannot come
to depend on them. Tests, benchmarks and the test suite's leak check import this module on
purpose, to look at what the server holds; the product's code never does (import-linter keeps
the generic sandbox layer away from the emulator package, and nothing else reaches it).
"""

from __future__ import annotations

from urllib.parse import quote

from osmosis_harbor.sandbox.emulator.client.http import session
from osmosis_harbor.sandbox.emulator.wire import PoolInfo
from osmosis_harbor.sandbox.sdk.calls import dual

__all__ = ["get_pool", "list_pools", "terminate_by_name"]


@dual
def get_pool(name: str) -> PoolInfo:
    """The pool's shape and its ready (``idle``), claimed and starting members."""
    return PoolInfo.model_validate_json(session().call("GET", f"/pools/{quote(name, safe='')}").content)


@dual
def list_pools() -> list[PoolInfo]:
    return [PoolInfo.model_validate(item) for item in session().call("GET", "/pools").json()]


@dual
def terminate_by_name(name: str) -> None:
    """Terminate the sandbox called ``name`` (idempotent)."""
    session().call("DELETE", f"/sandboxes/{quote(name, safe='')}")
