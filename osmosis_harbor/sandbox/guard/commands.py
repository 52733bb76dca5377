"""The guard's command lines, and what its start prints: the host's half of the program's modes
(``guard.c``), used by the agent environment and by ``sandbox-check``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from osmosis_harbor.errors import VerifierGuardError

__all__ = [
    "KEY_ENV",
    "RECORDED",
    "UPLOAD_PATH",
    "Started",
    "check_argv",
    "drop_prefix",
    "parse_started",
    "record_argv",
    "start_argv",
]

KEY_ENV = "OSMOSIS_GUARD_KEY"  # the start's environment only: the daemon keeps it, no one else
UPLOAD_PATH = "/var/tmp/osmosis-guard"  # when the image does not bake it in (a dir every image has: no parents made)
RECORDED = b"osmosis-guard recorded entries="
_STARTED = re.compile(rb"^osmosis-guard started pid=(\d+) marker=(\d+) arch=(\w+) entries=(\d+)\n")
# chmod: a file API may write 0644. Pristine here: nothing of the agent has run yet.
_RUN_UPLOADED = 'chmod 0755 "$0" && exec "$0" "$@"'


@dataclass(frozen=True)
class Started:
    """What a start printed: the daemon's pid, the capability that marks, the entries recorded."""

    daemon: int
    marker: int
    arch: str
    entries: int


def _workdirs(workdirs: list[str]) -> list[str]:
    return [arg for d in workdirs for arg in ("--workdir", d)]


def start_argv(path: str | None, record_id: str, workdirs: list[str]) -> list[str]:
    """The start, from the image's baked guard at ``path``, or (None) from ``UPLOAD_PATH``."""
    args = ["start", "--id", record_id, *_workdirs(workdirs)]
    return [path, *args] if path else ["/bin/sh", "-c", _RUN_UPLOADED, UPLOAD_PATH, *args]


def drop_prefix(daemon: int) -> list[str]:
    return [f"/proc/{daemon}/exe", "drop", "--"]


def record_argv(daemon: int, record_id: str, workdirs: list[str]) -> list[str]:
    return [f"/proc/{daemon}/exe", "record", "--daemon", str(daemon), "--id", record_id, *_workdirs(workdirs)]


def check_argv(
    daemon: int, nonce: str, record_id: str, workdirs: list[str], *, ports: list[int], keep_listening: bool
) -> list[str]:
    keep = ["--keep-listening"] if keep_listening else ["--keep-ports", ",".join(map(str, ports))] if ports else []
    argv = [f"/proc/{daemon}/exe", "check", "--daemon", str(daemon), "--nonce", nonce, "--id", record_id]
    return [*argv, *_workdirs(workdirs), *keep]


def parse_started(code: int, stdout: bytes, stderr: str, sandbox: str) -> Started:
    """A start's output; a start that failed is the sandbox's refusal, in its own words."""
    started = _STARTED.match(stdout)
    if code != 0 or started is None:
        reason = (stderr.strip().splitlines() or [f"exit {code}"])[-1][:300]
        raise VerifierGuardError(
            f"the verifier guard could not start in sandbox {sandbox}: {reason}; "
            "OSMOSIS_HARBOR_VERIFIER_GUARD=0 runs dataset verifiers unguarded"
        )
    return Started(int(started[1]), int(started[2]), started[3].decode(), int(started[4]))
