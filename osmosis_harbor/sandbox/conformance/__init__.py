"""A conformance suite for implementations of the ``sky.sandbox`` surface Harbor relies on.

One contract, several implementations (SkyPilot's real SDK, the local Docker emulation in
``osmosis_harbor.sandbox.docker``): the same checks run against any of them, so one run proves they agree on what
Harbor's ``SkypilotEnvironment`` depends on. Modelled on inspect_ai's sandbox ``self_check``:
each check is a small async function that raises ``AssertionError`` with a readable message,
and the runner turns that into a structured :class:`CheckResult`.

The checks use the surface exactly the way Harbor does (``create.aio``, ``exec.aio`` then
``await handle.wait()`` then ``handle.stdout.read()``, ``write_bytes.aio``, ``read_bytes.aio``,
``terminate.aio``), plus a blocking-API check and, optionally, warm pools. The limits checks
read back the bounds a sandbox really gets (cgroup memory, pids and CPU, the size of /tmp) and
prove them with a fork bomb, a memory hog and a /tmp fill; what an implementation does not
bound is named in the ``bounds`` check's detail.

Traffic rule: no check sends network traffic anywhere; the network check inspects interfaces
and routes inside the sandbox.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

# The check modules register their checks when imported, in the order the suite runs them.
# isort: off
from osmosis_harbor.sandbox.conformance import exec_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import file_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import lifecycle_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import limit_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import pool_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import environment_checks  # noqa: F401

# isort: on
from osmosis_harbor.sandbox.conformance.core import (
    CHECK_TIMEOUT_SEC,
    CHECKS,
    Check,
    CheckResult,
    ConformanceContext,
)

__all__ = [
    "CHECKS",
    "Check",
    "CheckResult",
    "ConformanceContext",
    "get_check",
    "run_check",
    "run_conformance",
    "selected_checks",
]


def selected_checks(*, include_pools: bool = True, only: Sequence[str] | None = None) -> list[Check]:
    chosen = [c for c in CHECKS if include_pools or not c.pools]
    if only is not None:
        unknown = set(only) - {c.name for c in CHECKS}
        if unknown:
            raise ValueError(f"unknown checks: {sorted(unknown)}")
        chosen = [c for c in chosen if c.name in only]
    return chosen


def get_check(name: str) -> Check:
    for item in CHECKS:
        if item.name == name:
            return item
    raise KeyError(name)


async def run_check(item: Check, ctx: ConformanceContext, *, timeout: float = CHECK_TIMEOUT_SEC) -> CheckResult:
    """Run one check; failures and errors become a result, never an exception."""
    started = time.monotonic()
    try:
        detail = await asyncio.wait_for(item.fn(ctx), timeout)
        passed = True
    except AssertionError as exc:
        passed, detail = False, str(exc) or "assertion failed"
    except TimeoutError:
        passed, detail = False, f"timed out after {timeout:.0f}s"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        passed, detail = False, f"{type(exc).__name__}: {exc}"
    return CheckResult(name=item.name, passed=passed, detail=detail, seconds=round(time.monotonic() - started, 3))


async def run_conformance(
    sdk: Any,
    image: str,
    *,
    include_pools: bool = True,
    only: Sequence[str] | None = None,
) -> list[CheckResult]:
    """Run the suite against *sdk* (an object with the ``sky.sandbox`` surface) on *image*."""
    ctx = ConformanceContext(sdk=sdk, image=image)
    try:
        return [await run_check(item, ctx) for item in selected_checks(include_pools=include_pools, only=only)]
    finally:
        await ctx.close()
