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
bound is named in the ``bounds`` check's detail. The ``privileges`` check reports a sandbox's
capability set and no-new-privileges. The archive checks run where a sandbox handle offers the
archive capability. The assumption checks (``assumption_checks.py``) observe what
SkyPilot's docs leave open and our code assumes (an empty pool's claim, ``create_pool`` twice,
``delete_pool`` with a claimed member, error shapes, exit 127, ``ls()`` records): each says
whether the assumption held, and fails only where our code would not survive what it saw.

A check passes, fails, is skipped (it applies but could not run here: ``skip``) or is not
applicable (the SDK lacks a capability it ``needs``); the report (`ConformanceReport`) counts
each apart, beside the SDK's capability set (``capabilities.py``), so a skip never reads as a pass.

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
from osmosis_harbor.sandbox.conformance import archive_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import lifecycle_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import limit_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import privilege_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import pool_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import environment_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import assumption_checks  # noqa: F401
from osmosis_harbor.sandbox.conformance import guard_checks  # noqa: F401

# isort: on
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.conformance.capabilities import Capabilities
from osmosis_harbor.sandbox.conformance.core import (
    CHECK_TIMEOUT_SEC,
    CHECKS,
    Check,
    CheckResult,
    CheckSkipped,
    CheckStatus,
    ConformanceContext,
    Observation,
)
from osmosis_harbor.sandbox.conformance.report import ConformanceReport
from osmosis_harbor.sandbox.owner.context import owner_scope
from osmosis_harbor.settings import Settings

__all__ = [
    "CHECKS",
    "Capabilities",
    "Check",
    "CheckResult",
    "CheckStatus",
    "ConformanceContext",
    "ConformanceReport",
    "get_check",
    "run_check",
    "run_conformance",
    "run_suite",
    "selected_checks",
]


def selected_checks(*, include_pools: bool = True, only: Sequence[str] | None = None) -> list[Check]:
    chosen = [c for c in CHECKS if include_pools or not c.pools]
    if only is not None:
        unknown = set(only) - {c.name for c in CHECKS}
        if unknown:
            names = ", ".join(c.name for c in CHECKS)
            raise ConfigError(f"unknown sandbox-check check(s) {', '.join(sorted(unknown))}: choose from {names}")
        chosen = [c for c in chosen if c.name in only]
    return chosen


def get_check(name: str) -> Check:
    for item in CHECKS:
        if item.name == name:
            return item
    raise KeyError(name)


def _status_for(item: Check, capabilities: Capabilities) -> tuple[CheckStatus, str] | None:
    """Not applicable when the SDK definitely lacks a capability the check is about."""
    missing = [name for name in item.needs if capabilities.lacks(name)]
    if missing:
        return CheckStatus.NOT_APPLICABLE, f"this SDK does not offer {', '.join(missing)}"
    return None


async def run_check(item: Check, ctx: ConformanceContext, *, timeout: float = CHECK_TIMEOUT_SEC) -> CheckResult:
    """Run one check; failures and errors become a result, never an exception."""
    started = time.monotonic()
    status, detail, held = CheckStatus.FAILED, "", None
    try:
        early = _status_for(item, await ctx.capabilities()) if item.needs else None
        if early is not None:
            status, detail = early
        else:
            outcome = await asyncio.wait_for(item.fn(ctx), timeout)
            if isinstance(outcome, Observation):
                held, detail = outcome.held, outcome.detail
            else:
                detail = str(outcome)
            status = CheckStatus.PASSED
    except CheckSkipped as exc:
        status, detail = CheckStatus.SKIPPED, str(exc)
    except AssertionError as exc:
        detail = str(exc) or "assertion failed"
    except TimeoutError:
        detail = f"timed out after {timeout:.0f}s"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        detail = f"{type(exc).__name__}: {exc}"
    return CheckResult(
        name=item.name,
        status=status,
        detail=detail,
        seconds=round(time.monotonic() - started, 3),
        assumption=item.assumption,
        held=held,
    )


def _deselected(item: Check, reason: str) -> CheckResult:
    return CheckResult(
        name=item.name, status=CheckStatus.SKIPPED, detail=reason, seconds=0.0, assumption=item.assumption
    )


async def run_suite(
    sdk: Any,
    image: str,
    *,
    config: Settings,
    include_pools: bool = True,
    only: Sequence[str] | None = None,
) -> ConformanceReport:
    """Run the suite against *sdk* (an object with the ``sky.sandbox`` surface) on *image*.

    Pool checks left out with ``include_pools=False`` are reported as skipped, not dropped."""
    ctx = ConformanceContext(sdk=sdk, image=image, settings=config)
    chosen = selected_checks(only=only)
    try:
        with owner_scope(ctx.owner):  # what the environment checks make is the run's
            capabilities = await ctx.capabilities()
            results = [
                await run_check(item, ctx)
                if include_pools or not item.pools
                else _deselected(item, "pool checks deselected (--no-pools)")
                for item in chosen
            ]
    finally:
        await ctx.close()
    return ConformanceReport(sdk=capabilities.sdk, image=image, capabilities=capabilities, results=results)


async def run_conformance(
    sdk: Any,
    image: str,
    *,
    config: Settings,
    include_pools: bool = True,
    only: Sequence[str] | None = None,
) -> list[CheckResult]:
    """The results of `run_suite` alone."""
    return (await run_suite(sdk, image, config=config, include_pools=include_pools, only=only)).results
