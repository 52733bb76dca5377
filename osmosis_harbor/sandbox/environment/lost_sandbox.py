"""Every command and transfer, awaited through `LossGuard.guarded`, tells a lost sandbox apart
from the workflow's own failure (what ``ls`` says is ``sdk/liveness.py``'s).

After a call fails (an error, or a non-zero exit), the SDK's ``ls`` says whether the sandbox is
gone or stopped without this trial stopping it: then `SandboxLostError`, which trials read as an
``internal_error`` and ``infra_retries`` may retry on a fresh sandbox; or, when ``ls`` says it was
evicted past its own disk bound, `SandboxDiskBoundError`, the workflow's ``agent_error``. An API
fault mid-call also loses the sandbox to the trial, as the call may have run (``sdk/faults.py``).
Every loss raised is also handed to the trial's loss sink (``owner.context.TrialContext.record_loss``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Awaitable, Callable, Iterator

from harbor.environments.base import ExecResult
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_delay, wait_exponential

from osmosis_harbor.errors import SandboxDiskBoundError, SandboxLostError
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.owner.context import Role
from osmosis_harbor.sandbox.sdk.errors import is_api_fault, is_missing
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, retry_safe
from osmosis_harbor.sandbox.sdk.liveness import SandboxState, sandbox_state

__all__ = ["LOSS_SETTLE_SEC", "LossGuard", "LossSink", "missing_as_file_not_found"]

log = logging.getLogger(__name__)

# How long a sandbox may still look alive after a command in it was killed, before the
# command's death counts as the workflow's own (the engine reports the two separately).
LOSS_SETTLE_SEC = 2.0


def _last_answer(state: RetryCallState) -> SandboxState:
    """Still live after the settle time: that last answer stands (not an error)."""
    assert state.outcome is not None
    return state.outcome.result()


# Where a loss is told (the trial context's sink): Harbor may wrap or swallow the raise.
LossSink = Callable[[SandboxLostError], None]


class LossGuard:
    """Lost-sandbox detection around every call into one environment's sandbox."""

    def __init__(self, state: EnvironmentState, role: Role, sink: LossSink, retry: ApiRetry) -> None:
        self._state = state
        self.retry = retry  # the sandbox's calls faulted by the API are tried again within it
        self.role = role.value  # carried by every loss raised (``errors.AgentSandboxLostError``, ...)
        self._sink = sink

    async def guarded[T](self, call: Awaitable[T]) -> T:
        """Await *call*; if it fails (an error, or a non-zero exit), tell a lost sandbox apart."""
        state = self._state
        if state.gone:  # known gone: fail fast, no round trip
            if asyncio.iscoroutine(call):
                call.close()
            if state.evicted is not None:
                raise SandboxDiskBoundError(state.evicted.sandbox_name, state.evicted.message)
            assert state.lost is not None
            raise SandboxLostError.of_role(self.role, state.lost.sandbox_name, state.lost.reason)
        try:
            result = await call
        except (FileNotFoundError, IsADirectoryError):  # a definite answer from a live sandbox
            raise
        except Exception as exc:  # a strict SDK's "not found" may be the sandbox's: ls decides at once
            await self.raise_if_lost(exc, killed=not is_missing(exc))
            if is_api_fault(exc) and not state.stopping:
                # The call may have run (an exec is never retried): its effects are unknown, so
                # this sandbox is lost to the trial; a retry gets a fresh one (``sdk/faults.py``).
                reason = f"the sandbox API failed mid-call: {exc}"
                state.lost = SandboxLostError.of_role(self.role, state.name, reason)
                self._sink(state.lost)
                raise SandboxLostError.of_role(self.role, state.name, reason) from exc
            raise
        if isinstance(result, ExecResult) and result.return_code != 0:
            await self.raise_if_lost(None, killed=not 0 < result.return_code < 128)
        return result

    async def raise_if_lost(self, cause: BaseException | None, *, killed: bool) -> None:
        """Raise `SandboxLostError` if the sandbox is gone or no longer running.

        ``killed``: the command died by a signal or its call failed, as it does when its
        sandbox goes away. The engine may report the command's end a moment before the
        sandbox's, so a live answer is checked again for up to ``LOSS_SETTLE_SEC``.
        """
        state = self._state
        if state.stopping or state.sandbox is None:
            return  # we stopped it (or never had one): not the infrastructure's doing
        try:
            answer = await self._settled_state(LOSS_SETTLE_SEC if killed else 0.0)
        except Exception as exc:  # cannot tell: leave the original failure as it is
            log.warning("cannot check sandbox %s after a failure: %s", state.name, exc)
            return
        if answer.live or state.stopping:
            return
        if answer.over_own_disk_bound:  # its own writes: the workflow's failure, not a loss
            state.evicted = SandboxDiskBoundError(state.name, answer.message or "")
            raise SandboxDiskBoundError(state.name, state.evicted.message) from cause
        state.lost = SandboxLostError.of_role(self.role, state.name, answer.loss_reason())
        self._sink(state.lost)
        raise SandboxLostError.of_role(self.role, state.name, state.lost.reason) from cause

    async def _settled_state(self, settle_sec: float) -> SandboxState:
        state = self._state
        retrying = AsyncRetrying(
            retry=retry_if_result(lambda answer: answer.live and not state.stopping),
            stop=stop_after_delay(settle_sec),
            wait=wait_exponential(multiplier=0.05, max=0.5),
            retry_error_callback=_last_answer,
        )
        return await retrying(retry_safe, "ls", self.retry, sandbox_state, state.sdk, state.name)


@contextlib.contextmanager
def missing_as_file_not_found(path: str) -> Iterator[None]:
    """A read of a missing file raises ``FileNotFoundError`` whatever the SDK's shape of "not
    found" (SkyPilot's is a status, not a builtin), once the sandbox is known alive (a loss
    stays a loss)."""
    try:
        yield
    except SandboxLostError:
        raise
    except Exception as exc:
        if is_missing(exc) and not isinstance(exc, FileNotFoundError):
            raise FileNotFoundError(errno.ENOENT, f"no such file in the sandbox ({exc})", path) from exc
        raise
