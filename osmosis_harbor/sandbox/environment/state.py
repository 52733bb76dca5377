"""What one environment knows of its sandbox as a trial goes on, in one place: the
environment owns it, and each collaborator reads and changes the part of it that is its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from osmosis_harbor.errors import SandboxDiskBoundError, SandboxLostError
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk
from osmosis_harbor.sandbox.transfer.archives import ArchiveTransfers

__all__ = ["EnvironmentState", "StateView"]


@dataclass
class EnvironmentState:
    """The mutable state of one environment's sandbox (Harbor's ``_sandbox``, ``_sandbox_name``
    and ``_pool`` are views of it on the environment)."""

    sdk: SandboxSdk
    name: str  # the DNS-1123 sandbox name; a batch claim's member name once claimed
    pool: str | None  # the pool a launch claims from (None: a plain create)
    generic_pool: bool  # that pool's image is generic (SkyPilot's ``default``), not this environment's
    sandbox: Any | None = None  # the live handle
    stopping: bool = False  # set once this trial stops the sandbox itself
    lost: SandboxLostError | None = None
    evicted: SandboxDiskBoundError | None = None  # past its own disk bound
    known_ready: set[str] = field(default_factory=set)  # dirs known to exist, empty and 0777
    scope: list[str] | None = None  # the paths the running preparation command touches
    archive_transfers: ArchiveTransfers | None = None
    records_read: list[str] = field(default_factory=list)  # exec records whose result the host holds

    @property
    def gone(self) -> bool:
        """Known lost or evicted: every further call fails fast."""
        return self.lost is not None or self.evicted is not None


class StateView[T]:
    """An attribute Harbor's own code reads and sets on the environment (``_sandbox``, ...),
    kept as a field of the environment's one state."""

    def __init__(self, field_name: str) -> None:
        self._field = field_name

    def __get__(self, env: Any, owner: type | None = None) -> T:
        if env is None:
            return self  # type: ignore[return-value]  # on the class: the descriptor itself
        value: T = getattr(env._state, self._field)
        return value

    def __set__(self, env: Any, value: T) -> None:
        setattr(env._state, self._field, value)
