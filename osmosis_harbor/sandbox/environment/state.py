"""What one environment knows of its sandbox as a trial goes on, in one place: the session
(``session.py``) holds it, and each collaborator reads and changes the part of it that is its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from osmosis_harbor.errors import SandboxDiskBoundError, SandboxLostError
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk

__all__ = ["EnvironmentState"]


@dataclass
class EnvironmentState:
    """The mutable state of one environment's sandbox. What is staged and what is known ready
    are not here: the transfer router alone holds them (``routes.py``)."""

    sdk: SandboxSdk
    name: str  # the DNS-1123 sandbox name; a batch claim's member name once claimed
    pool: str | None  # the pool a launch claims from (None: a plain create)
    generic_pool: bool  # that pool's image is generic (SkyPilot's ``default``), not this environment's
    sandbox: Any | None = None  # the live handle
    stopping: bool = False  # set once this trial stops the sandbox itself
    lost: SandboxLostError | None = None
    evicted: SandboxDiskBoundError | None = None  # past its own disk bound
    records_read: list[str] = field(default_factory=list)  # exec records whose result the host holds

    @property
    def gone(self) -> bool:
        """Known lost or evicted: every further call fails fast."""
        return self.lost is not None or self.evicted is not None
