"""The environment side of ``sdk/liveness.py``: every command and transfer, awaited through
`LossDetection._guarded`, tells a lost sandbox apart from the workflow's own failure.

A mixin of ``SandboxEnvironment`` (``sandbox_environment.py``). After a call fails (an error, or a
non-zero exit), the SDK's ``ls`` says whether the sandbox is gone or stopped without this
trial stopping it: then `SandboxLostError`, which trials read as an ``internal_error`` and
``infra_retries`` may retry on a fresh sandbox; or, when ``ls`` says it was evicted past its own
disk bound, `SandboxDiskBoundError`, the workflow's ``agent_error``. An API fault mid-call also
loses the sandbox to the trial, as the call may have run (``sdk/faults.py``). Every loss raised
is also handed to the trial's ``liveness.loss_scope`` (``backend/losses.py`` says why). The
SDK-side half, what ``ls`` says and the loss scope, sits in ``sdk/`` below the environment, so
``sdk/faults.py`` and the owner's modules use it without depending on the environment.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable
from typing import Any

from harbor.environments.base import ExecResult
from harbor.environments.skypilot import SkypilotEnvironment
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_delay, wait_exponential

from osmosis_harbor.errors import SandboxDiskBoundError, SandboxLostError
from osmosis_harbor.sandbox.owner.head_start import VERIFIER_SESSION_MARK
from osmosis_harbor.sandbox.sdk.errors import is_api_fault, is_missing
from osmosis_harbor.sandbox.sdk.faults import retry_safe
from osmosis_harbor.sandbox.sdk.liveness import SandboxState, record_loss, sandbox_state
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk

__all__ = ["LOSS_SETTLE_SEC", "LossDetection"]

log = logging.getLogger(__name__)

# How long a sandbox may still look alive after a command in it was killed, before the
# command's death counts as the workflow's own (the engine reports the two separately).
LOSS_SETTLE_SEC = 2.0


def _last_answer(state: RetryCallState) -> SandboxState:
    """Still live after the settle time: that last answer stands (not an error)."""
    assert state.outcome is not None
    return state.outcome.result()


class LossDetection(SkypilotEnvironment):
    """Lost-sandbox detection around every call into the sandbox (see the module docstring)."""

    _sdk: SandboxSdk
    _sandbox: Any | None
    _stopping: bool  # set once this trial stops the sandbox itself
    _lost: SandboxLostError | None
    _evicted: SandboxDiskBoundError | None

    @functools.cached_property
    def loss_role(self) -> str:
        """Whose sandbox this is, carried by every loss it raises (``errors.AgentSandboxLostError``,
        ``VerifierSandboxLostError``): decided once, from the session id Harbor gave this
        environment (a separate verifier's is ``{trial}__verifier__{key}``, the mark the head start
        reads too), never from a lost sandbox's name."""
        return "verifier" if VERIFIER_SESSION_MARK in self.session_id else "agent"

    async def _guarded[T](self, call: Awaitable[T]) -> T:
        """Await *call*; if it fails (an error, or a non-zero exit), tell a lost sandbox apart."""
        if self._lost is not None or self._evicted is not None:  # known gone: fail fast, no round trip
            if asyncio.iscoroutine(call):
                call.close()
            if self._evicted is not None:
                raise SandboxDiskBoundError(self._evicted.sandbox_name, self._evicted.message)
            assert self._lost is not None
            raise SandboxLostError.of_role(self.loss_role, self._lost.sandbox_name, self._lost.reason)
        try:
            result = await call
        except (FileNotFoundError, IsADirectoryError):  # a definite answer from a live sandbox
            raise
        except Exception as exc:  # a strict SDK's "not found" may be the sandbox's: ls decides at once
            await self._raise_if_lost(exc, killed=not is_missing(exc))
            if is_api_fault(exc) and not self._stopping:
                # The call may have run (an exec is never retried): its effects are unknown, so
                # this sandbox is lost to the trial; a retry gets a fresh one (``sdk/faults.py``).
                reason = f"the sandbox API failed mid-call: {exc}"
                self._lost = SandboxLostError.of_role(self.loss_role, self._sandbox_name, reason)
                record_loss(self._lost)  # Harbor may wrap or swallow the raise (liveness.loss_scope)
                raise SandboxLostError.of_role(self.loss_role, self._sandbox_name, reason) from exc
            raise
        if isinstance(result, ExecResult) and result.return_code != 0:
            await self._raise_if_lost(None, killed=not 0 < result.return_code < 128)
        return result

    async def _raise_if_lost(self, cause: BaseException | None, *, killed: bool) -> None:
        """Raise `SandboxLostError` if the sandbox is gone or no longer running.

        ``killed``: the command died by a signal or its call failed, as it does when its
        sandbox goes away. The engine may report the command's end a moment before the
        sandbox's, so a live answer is checked again for up to ``LOSS_SETTLE_SEC``.
        """
        if self._stopping or self._sandbox is None:
            return  # we stopped it (or never had one): not the infrastructure's doing
        try:
            state = await self._settled_state(LOSS_SETTLE_SEC if killed else 0.0)
        except Exception as exc:  # cannot tell: leave the original failure as it is
            log.warning("cannot check sandbox %s after a failure: %s", self._sandbox_name, exc)
            return
        if state.live or self._stopping:
            return
        if state.over_own_disk_bound:  # its own writes: the workflow's failure, not a loss
            self._evicted = SandboxDiskBoundError(self._sandbox_name, state.message or "")
            raise SandboxDiskBoundError(self._sandbox_name, self._evicted.message) from cause
        self._lost = SandboxLostError.of_role(self.loss_role, self._sandbox_name, state.loss_reason())
        record_loss(self._lost)  # Harbor may wrap or swallow the raise (liveness.loss_scope)
        raise SandboxLostError.of_role(self.loss_role, self._sandbox_name, self._lost.reason) from cause

    async def _settled_state(self, settle_sec: float) -> SandboxState:
        retrying = AsyncRetrying(
            retry=retry_if_result(lambda state: state.live and not self._stopping),
            stop=stop_after_delay(settle_sec),
            wait=wait_exponential(multiplier=0.05, max=0.5),
            retry_error_callback=_last_answer,
        )
        return await retrying(retry_safe, "ls", sandbox_state, self._sdk, self._sandbox_name)
