"""Telling a command that failed from a sandbox that was lost.

A workflow that exits non-zero (137 included: it may kill itself, or be OOM-killed inside the
task's memory limit, which is its own doing) leaves a running sandbox behind. A sandbox that
the infrastructure killed, removed or lost with its node does not: it is gone, or no longer
running although this trial never stopped it. After a command fails, the environment asks
the SDK which of the two happened, through ``ls()``: the one status call both the SkyPilot
Sandbox SDK and the Docker emulation offer (``sandbox-check`` proves they agree on it), and
raises `SandboxLostError` for the second. Trials read it as an ``internal_error``, and
``HarborBackend(infra_retries=N)`` may run the rollout again on a fresh sandbox.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from osmosis_harbor.errors import SandboxLostError
from osmosis_harbor.sandbox.protocol import SandboxSdk

__all__ = ["SandboxLostError", "SandboxState", "sandbox_state"]

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


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


async def sandbox_state(sdk: SandboxSdk, name: str) -> SandboxState:
    """The sandbox's state according to ``sdk.ls``; raises whatever ``ls`` raises."""
    for record in await sdk.ls.aio():
        if _field(record, "name") == name:
            status = _field(record, "status")
            return SandboxState(name=name, status=str(getattr(status, "value", status)))
    return SandboxState(name=name, status=None)
