"""Telling a command that failed from a sandbox that was lost.

A workflow that exits non-zero (137 included: it may kill itself, or be OOM-killed inside the
task's memory limit, which is its own doing) leaves a running sandbox behind. A sandbox that
the infrastructure killed, removed or lost with its node does not: it is gone, or no longer
running although this trial never stopped it. After a command fails, the environment asks
the SDK which of the two happened, through ``ls()``: the one status call both the SkyPilot
Sandbox SDK and the Docker emulation offer (``sandbox-check`` proves they agree on it), and
raises `SandboxLostError` for the second. Trials read it as an ``internal_error``, and
``HarborBackend(infra_retries=N)`` may run the rollout again on a fresh sandbox. One exception:
a sandbox evicted for passing its own disk bound (kubelet's message for a pod past its
ephemeral-storage limit, which the local SDKs give too, in the record's ``status_message``, and
theirs for the inode bound) is the workflow's doing: `SandboxDiskBoundError`, an ``agent_error``.
An eviction for the node's own pressure ("The node was low on resource") stays a loss.

The environment also hands every loss it raises to the trial's scope (``owner.context.TrialContext.record_loss``),
since Harbor does not always let the error reach the trial's result (``backend/losses.py`` says how it is read).
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from osmosis_harbor.errors import SandboxLostError
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk

__all__ = ["SandboxLostError", "SandboxState", "sandbox_state"]

# Statuses of a sandbox that can still run commands ("running" for Docker, "RUNNING" / "READY"
# style names for SkyPilot pods; compared case-insensitively).
LIVE_STATUSES = frozenset({"running", "ready", "up"})
# kubelet's two messages for a pod evicted for its own ephemeral storage (a container's limit,
# or the pod's total), never the node-pressure one; and the local SDKs' for their inode bound.
OWN_STORAGE_LIMIT = re.compile(
    r"exceeded its local ephemeral storage (?:inode )?limit|ephemeral local storage usage exceeds the total limit",
    re.I,
)


class SandboxState(BaseModel):
    """What ``ls()`` says about one sandbox: absent (status None), or listed with a status."""

    name: str
    status: str | None
    message: str | None = None  # the SDK's word on why it stopped, when it gives one

    @property
    def live(self) -> bool:
        return self.status is not None and self.status.lower() in LIVE_STATUSES

    @property
    def over_own_disk_bound(self) -> bool:
        """Stopped because its own writes passed its ephemeral-storage bound."""
        return not self.live and bool(self.message and OWN_STORAGE_LIMIT.search(self.message))

    def loss_reason(self) -> str:
        if self.status is None:
            return "container gone: killed or removed by the infrastructure"
        said = f": {self.message}" if self.message else ""
        return f"container {self.status}: killed or stopped by the infrastructure, not by this trial{said}"


async def sandbox_state(sdk: SandboxSdk, name: str) -> SandboxState:
    """The sandbox's state according to ``sdk.ls``; raises whatever ``ls`` raises."""
    for record in await sdk.ls.aio():
        if records.name_of(record) == name:
            message = records.field_of(record, "status_message")
            return SandboxState(
                name=name,
                status=records.status_of(record) or "unknown",
                message=str(message)[:500] if message else None,
            )
    return SandboxState(name=name, status=None)
