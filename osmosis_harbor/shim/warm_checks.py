"""What a caller must share with the warm process before the warm process runs its code.

Why: the warm process runs the caller's phase in a child of its own, with its own credentials,
capabilities, seccomp filter, namespaces and limits, not the caller's. That is correct only when
the two are the same; a caller with less (a non-root agent user, a process the verifier guard
marked by dropping a capability, one under a stricter seccomp filter or in other namespaces)
would otherwise get its code run with more privilege than it holds. So every field of
``/proc/<pid>/status`` that says what a process may do, every namespace, the cgroup, the LSM
label and the resource limits must be equal, or the caller runs cold.

The caller is identified by the kernel (``SO_PEERCRED``, and a pidfd of the connecting process,
``SO_PEERPIDFD``), never by what it says. The pidfd closes the pid-reuse race: ``/proc/<pid>`` is
read, then the pidfd must still name a live process, so the files read were that process's. A
kernel without ``SO_PEERPIDFD`` (before Linux 6.5) gets no warm run.
"""

from __future__ import annotations

import os
import signal
import socket
import struct

__all__ = ["peer_mismatch"]

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5 (asm-generic value, x86 and arm64 alike)
# The lines of /proc/<pid>/status that say what a process may do.
STATUS_FIELDS = (
    "Umask",
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
)
# Other per-process facts that change what code may do (a missing file reads as absent on both sides).
OTHER_FILES = ("cgroup", "limits", "attr/current", "attr/apparmor/current", "loginuid")


def _status(proc: str) -> dict[str, str]:
    with open(f"{proc}/status", encoding="utf-8", errors="replace") as f:
        lines = dict(line.rstrip("\n").split(":", 1) for line in f if ":" in line)
    return {name: " ".join(lines.get(name, "<absent>").split()) for name in STATUS_FIELDS}


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode("utf-8", "replace")
    except OSError as exc:
        return f"<{type(exc).__name__}>"


def _namespaces(proc: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir("/proc/self/ns")):
        try:
            out[name] = os.readlink(f"{proc}/ns/{name}")
        except OSError as exc:
            out[name] = f"<{type(exc).__name__}>"
    return out


def _facts(proc: str) -> dict[str, object]:
    return {
        "status": _status(proc),
        "ns": _namespaces(proc),
        **{name: _read(f"{proc}/{name}") for name in OTHER_FILES},
    }


def _differences(mine: dict[str, object], theirs: dict[str, object]) -> list[str]:
    out = []
    for key, value in mine.items():
        other = theirs.get(key)
        if isinstance(value, dict) and isinstance(other, dict):
            out += [f"{key}.{k}" for k in value if value[k] != other.get(k)]
        elif value != other:
            out.append(key)
    return out


def peer_mismatch(conn: socket.socket) -> str | None:
    """Why the process at the other end of ``conn`` may not be served, or None when it holds
    exactly this process's privileges."""
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if pid <= 0:
        return "the caller is in another pid namespace"
    if (uid, gid) != (os.geteuid(), os.getegid()):
        return f"the caller runs as uid {uid} gid {gid}, the warm interpreter as {os.geteuid()} {os.getegid()}"
    try:
        pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError:
        return "the kernel names no caller process (SO_PEERPIDFD: Linux >= 6.5)"
    try:
        try:
            theirs = _facts(f"/proc/{pid}")
        except OSError:
            return "the caller's /proc entry is unreadable"
        try:
            signal.pidfd_send_signal(pidfd, 0)  # still the process that connected: what was read is its own
        except OSError:
            return "the caller ended before it was checked"
    finally:
        os.close(pidfd)
    differ = _differences(_facts("/proc/self"), theirs)
    if differ:
        return "the caller's privileges differ from the warm interpreter's: " + ", ".join(differ)
    return None
