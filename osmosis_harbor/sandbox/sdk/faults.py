"""Which ``sky.sandbox`` calls survive an API fault by being retried, and which may not be.

A sandbox API server answers 503 or 429, resets a connection or hangs; a call that failed that
way may or may not have run on the server. Whether trying again is safe depends on the call,
and is decided here, once (``CALL_SAFETY``, the retry table in docs/operations.md):

* ``ls``, ``read_bytes``: reads, always safe;
* ``terminate``, ``delete_pool``: idempotent (a second terminate of a gone sandbox is a no-op),
  safe;
* ``write_bytes``: the same bytes written again, safe;
* ``create`` (by name): safe only when ``ls`` shows the first call did not happen
  (``create_checked``); when it did, the half-made sandbox is terminated by name first;
* ``exec``: never retried bare once it may have started (the command may have run). Where the
  SDK's results cross an API, each exec runs under a record whose claim makes a relaunch safe and
  whose result survives a failed read (``environment/exec_records.py``); elsewhere a fault on its
  launch becomes a `SandboxLostError`, so the rollout is retried on a fresh sandbox
  (``infra_retries``) or reported as an ``internal_error``.

Retries are jittered and bounded (``Settings.api_attempts``, ``Settings.api_retry_max_wait``),
carried as an `ApiRetry` made by whoever holds the settings (the owner, the environment, a command).
An SDK may retry a refusal itself before this layer sees it (the emulator does, like
SkyPilot's client); this layer adds the retries of calls the SDK cannot know are safe. What
counts as an API fault is ``sdk.errors.is_api_fault``: by HTTP status and SkyPilot's documented
error names, or by builtin family for the Docker SDK.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.errors import is_api_fault
from osmosis_harbor.sandbox.sdk.liveness import sandbox_state
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk
from osmosis_harbor.settings import Settings

__all__ = [
    "CALL_SAFETY",
    "ApiRetry",
    "Safety",
    "create_checked",
    "is_api_fault",
    "retry_safe",
    "terminate_by_name",
    "terminate_record",
]

log = logging.getLogger(__name__)


class Safety(StrEnum):
    SAFE = "safe"  # retried
    SAFE_IF_ABSENT = "safe when ls shows it did not happen"
    UNSAFE_ONCE_STARTED = "not retried once it may have started"


CALL_SAFETY: dict[str, Safety] = {
    "ls": Safety.SAFE,
    "set_pool_size": Safety.SAFE,
    "read_bytes": Safety.SAFE,
    "write_bytes": Safety.SAFE,
    "terminate": Safety.SAFE,
    "delete_pool": Safety.SAFE,
    "create": Safety.SAFE_IF_ABSENT,
    "exec": Safety.UNSAFE_ONCE_STARTED,
}


@dataclass(frozen=True)
class ApiRetry:
    """How often, and how patiently, a call that met an API fault is tried again."""

    attempts: int  # ``Settings.api_attempts``: tries in all
    max_wait: float  # ``Settings.api_retry_max_wait``: the longest wait between two

    @classmethod
    def of(cls, current: Settings) -> ApiRetry:
        return cls(attempts=current.api_attempts, max_wait=current.api_retry_max_wait)

    def policy(self) -> dict[str, Any]:
        """tenacity's retry, stop and wait for a call retried on API faults, whether it is
        awaited (``retry_safe``) or blocking (the ledger's reaper): jittered and bounded."""
        return {
            "retry": retry_if_exception(is_api_fault),
            "stop": stop_after_attempt(self.attempts),
            "wait": wait_random_exponential(multiplier=0.2, max=self.max_wait),
            "reraise": True,
        }


def _retrying(call: str, retry: ApiRetry) -> AsyncRetrying:
    if CALL_SAFETY[call] is not Safety.SAFE:
        raise ConfigError(f"sandbox call {call!r} is not safe to retry blindly ({CALL_SAFETY[call]})")
    return AsyncRetrying(
        **retry.policy(),
        before_sleep=lambda state: log.info("retrying sandbox %s after an API fault: %s", call, state.outcome),
    )


async def retry_safe[T](call: str, retry: ApiRetry, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)``, retried on API faults as ``retry`` says; ``call`` must be a safe one."""
    return await _retrying(call, retry)(fn, *args, **kwargs)


async def terminate_record(sdk: SandboxSdk, record: Any, retry: ApiRetry) -> None:
    """Terminate the sandbox an ``ls()`` record stands for. SkyPilot's records are terminable
    handles; an SDK that offers a terminate by name itself (the Docker SDK's
    ``terminate_by_name``, whose records are plain) is asked that way."""
    by_name = getattr(sdk, "terminate_by_name", None)
    if by_name is not None:
        await retry_safe("terminate", retry, by_name.aio, records.name_of(record))
        return
    terminate = getattr(record, "terminate", None)
    if terminate is None:
        name = records.name_of(record)
        raise ConfigError(f"sandbox {name}: this SDK's ls() records cannot be terminated; remove it by hand")
    await retry_safe("terminate", retry, terminate.aio, wait=True)


async def terminate_by_name(sdk: SandboxSdk, name: str, retry: ApiRetry) -> None:
    """Terminate a sandbox nobody holds a handle to (a crashed owner's, a half-made create).
    SkyPilot documents no terminate by name: its ``ls()`` records are terminable handles, so
    the record is found and terminated (`terminate_record`). Absent is done."""
    if getattr(sdk, "terminate_by_name", None) is not None:
        await terminate_record(sdk, {"name": name}, retry)
        return
    for record in await retry_safe("ls", retry, sdk.ls.aio):
        if records.name_of(record) == name:
            await terminate_record(sdk, record, retry)
            return


async def create_checked[T](sdk: SandboxSdk, name: str, create: Callable[[], Awaitable[T]], retry: ApiRetry) -> T:
    """``create()`` of the sandbox ``name``, retried after an API fault only once ``ls`` showed
    the failed call made nothing (a sandbox it did make is terminated by name first)."""
    attempts = retry.attempts
    for attempt in range(1, attempts + 1):
        try:
            return await create()
        except Exception as exc:
            if not is_api_fault(exc) or attempt == attempts:
                raise
            await asyncio.sleep(random.uniform(0, min(retry.max_wait, 0.2 * 2**attempt)))
            state = await retry_safe("ls", retry, sandbox_state, sdk, name)
            if state.status is not None:
                log.info("create of %s failed (%s) but made it: terminating it before trying again", name, exc)
                await terminate_by_name(sdk, name, retry)
            else:
                log.info("create of %s failed (%s) and made nothing: trying again", name, exc)
    raise AssertionError("unreachable")
