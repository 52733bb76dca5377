"""The process a sandbox (or a marked trial directory) belongs to, and whether it is dead.

Recorded as labels on Docker sandboxes and as the content of the key-custody marker, so that
another process can tell a crashed owner's leftovers (reaped, swept) from a live one's.
"""

from __future__ import annotations

import os
import socket

from pydantic import BaseModel, ConfigDict

OWNER_PID = "osmosis-harbor.owner-pid"
OWNER_HOST = "osmosis-harbor.owner-host"
OWNER_START = "osmosis-harbor.owner-start"


def _pid(raw: str | None) -> int | None:
    try:
        return int(float(raw)) if raw not in (None, "") else None
    except ValueError:
        return None


def _proc_start_ticks(pid: int) -> str | None:
    """Kernel start time of *pid* (clock ticks since boot), to detect pid reuse.

    Field 22 of /proc/<pid>/stat; the command name (field 2) may contain spaces, so split
    after its closing parenthesis.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


class OwnerProcess(BaseModel):
    """The process a sandbox belongs to; when it dies the sandbox may be reaped."""

    model_config = ConfigDict(frozen=True)

    pid: int
    host: str
    start: str | None = None

    @classmethod
    def current(cls) -> OwnerProcess:
        pid = os.getpid()
        return cls(pid=pid, host=socket.gethostname(), start=_proc_start_ticks(pid))

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> OwnerProcess | None:
        pid = _pid(labels.get(OWNER_PID))
        if pid is None:
            return None
        return cls(pid=pid, host=labels.get(OWNER_HOST, ""), start=labels.get(OWNER_START) or None)

    def labels(self) -> dict[str, str]:
        out = {OWNER_PID: str(self.pid), OWNER_HOST: self.host}
        if self.start:
            out[OWNER_START] = self.start
        return out

    def is_dead(self) -> bool:
        """Only owners on this host can be judged; a pid reused by another process is dead too."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # exists, owned by someone else
        if self.start is not None:
            current = _proc_start_ticks(self.pid)
            if current is not None and current != self.start:
                return True
        return False
