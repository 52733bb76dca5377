"""Telling a command that failed from a sandbox that was lost.

A workflow that exits non-zero (137 included: it may kill itself, or be OOM-killed inside the
task's memory limit, which is its own doing) leaves a running sandbox behind. A sandbox that
the infrastructure killed, removed or lost with its node does not: it is gone, or no longer
running although this trial never stopped it. After a command fails, the environment asks
the SDK which of the two happened, through ``ls()``: the one status call both the SkyPilot
Sandbox SDK and the Docker emulation offer (``sandbox-check`` proves they agree on it), and
raises `SandboxLostError` for the second. Trials read it as an ``internal_error``, and
``HarborBackend(infra_retries=N)`` may run the rollout again on a fresh sandbox.

Harbor does not always let that error reach the trial's result: it wraps a failed test upload
or verifier download (``AddTestsDirError``, ``DownloadVerifierDirError``, the loss as their
``__cause__``) and swallows a failed agent-log download as best-effort (then the verifier
finds no sample, which would read as the workflow's failure). So the environment also hands
every loss it raises to the trial's `loss_scope`, and the backend reads the trial through it
(``backend.losses``): what the host saw, whatever Harbor recorded.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from pydantic import BaseModel

from osmosis_harbor.errors import SandboxLostError
from osmosis_harbor.sandbox import records
from osmosis_harbor.sandbox.protocol import SandboxSdk

__all__ = ["SandboxLostError", "SandboxState", "loss_scope", "record_loss", "sandbox_state"]

# Statuses of a sandbox that can still run commands ("running" for Docker, "RUNNING" / "READY"
# style names for SkyPilot pods; compared case-insensitively).
LIVE_STATUSES = frozenset({"running", "ready", "up"})


class SandboxState(BaseModel):
    """What ``ls()`` says about one sandbox: absent (status None), or listed with a status."""

    name: str
    status: str | None

    @property
    def live(self) -> bool:
        return self.status is not None and self.status.lower() in LIVE_STATUSES

    def loss_reason(self) -> str:
        if self.status is None:
            return "container gone: killed or removed by the infrastructure"
        return f"container {self.status}: killed or stopped by the infrastructure, not by this trial"


async def sandbox_state(sdk: SandboxSdk, name: str) -> SandboxState:
    """The sandbox's state according to ``sdk.ls``; raises whatever ``ls`` raises."""
    for record in await sdk.ls.aio():
        if records.name_of(record) == name:
            return SandboxState(name=name, status=records.status_of(record) or "unknown")
    return SandboxState(name=name, status=None)


_LOSSES: contextvars.ContextVar[list[SandboxLostError] | None] = contextvars.ContextVar(
    "osmosis_harbor_sandbox_losses", default=None
)


@contextlib.contextmanager
def loss_scope() -> Iterator[list[SandboxLostError]]:
    """The losses of sandboxes made under this scope (a trial's task inherits it)."""
    losses: list[SandboxLostError] = []
    token = _LOSSES.set(losses)
    try:
        yield losses
    finally:
        _LOSSES.reset(token)


def record_loss(loss: SandboxLostError) -> None:
    """Tell the current trial's scope (if any) that its sandbox was lost."""
    losses = _LOSSES.get()
    if losses is not None:
        losses.append(loss)
