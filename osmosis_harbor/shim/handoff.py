"""The console scripts' half of a warm interpreter: hand this run to the warm process, or say no.

Why: ``<pkg>-agent`` and ``<pkg>-grade`` are on the rollout's critical path, and importing
``osmosis_ai``'s rollout machinery costs them 0.2-1 s each. A baked image may hold a warm Python
that imported it already (``warm.py``, started by the image's ENTRYPOINT). This module is what the
console script runs first: it imports only the standard library (so trying costs milliseconds),
connects to the warm process's socket and hands over what makes up this run: its stdin, stdout
and stderr and its working directory (as file descriptors, SCM_RIGHTS), its argv and its
environment (the rollout key travels in this message only, in memory, never in a file). The warm
process checks that the caller holds exactly its own privileges, forks one child that runs the
phase, and relays its exit status.

The rule that keeps it correct: until this side has committed (sent ``go``), any doubt means
``None``, and the caller runs cold, exactly as without a warm process. After the commit the run
may have started, so it never runs cold a second time: a lost status is a failed run.

The wire: frames of a 4-byte big-endian length and a JSON object. Request (with the four fds) ->
verdict ``{"ok": true, "pid": N}`` or ``{"ok": false, "why": "..."}`` -> ``{"go": true}`` -> the
status ``{"exit": N}`` or ``{"signal": N}``; after ``go`` this side may send ``{"signal": N}``
(SIGTERM, SIGINT, SIGHUP it received) for the run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "FORWARDED_SIGNALS",
    "LAUNCH_MARKER",
    "MAX_FRAME_BYTES",
    "PROTOCOL",
    "SOCKET_DIR",
    "SOCKET_PATH",
    "hand_off",
    "recv_frame",
    "send_frame",
]

SOCKET_DIR = "/opt/osmosis/warm"  # root's, mode 0700: only a caller of the warm process's uid reaches it
SOCKET_PATH = f"{SOCKET_DIR}/shim.sock"
# Made by the image's ENTRYPOINT before it starts the warm process, removed by that process once it
# listens (or by the ENTRYPOINT's shell when it exits): while it exists and the socket does not, a
# warm process is starting, and a run that starts then waits for its socket (STARTUP_WAIT_SEC).
LAUNCH_MARKER = f"{SOCKET_DIR}/launched"
STARTUP_WAIT_SEC = 3.0
PROTOCOL = 1
MAX_FRAME_BYTES = 1 << 20  # the environment (inline input at most 64 KiB) and argv fit well within
# The verdict comes once the warm side has finished its import (it listens before it imports) and
# checked the caller (milliseconds). Waiting for an import that began with the sandbox is never
# slower than starting one cold, so the bound is only for a warm side that is stuck.
VERDICT_TIMEOUT_SEC = 30.0
EXIT_LOST = 1  # committed, and the status never came: the run failed (it may have run)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_HEADER = struct.Struct(">I")


def send_frame(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One frame; ``fds`` ride the header's bytes (so they arrive with the frame's start)."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"a hand-off frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    header = _HEADER.pack(len(body))
    if fds:
        sent = socket.send_fds(sock, [header], list(fds))
        sock.sendall(header[sent:] + body)
    else:
        sock.sendall(header + body)


def _recv_exact(sock: socket.socket, n: int, into: bytearray) -> None:
    while len(into) < n:
        chunk = sock.recv(n - len(into))
        if not chunk:
            raise ConnectionError("the peer closed the hand-off connection")
        into += chunk


def recv_frame(sock: socket.socket, *, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One frame and the fds that came with it (at most ``max_fds``; more is a refusal). The fds
    are the caller's to close, also when this raises after receiving them."""
    fds: list[int] = []
    head = bytearray()
    if max_fds:
        data, fds, flags, _ = socket.recv_fds(sock, _HEADER.size, max_fds + 1)
        if not data:
            raise ConnectionError("the peer closed the hand-off connection")
        head += data
        if len(fds) > max_fds or flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            raise ValueError("a hand-off frame carried more file descriptors than allowed")
    try:
        _recv_exact(sock, _HEADER.size, head)
        (length,) = _HEADER.unpack(head)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"a hand-off frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
        body = bytearray()
        _recv_exact(sock, length, body)
        message = json.loads(body)
        if not isinstance(message, dict):
            raise ValueError("a hand-off frame is not a JSON object")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def _note(text: str) -> None:
    try:
        print(f"osmosis-harbor-shim: {text}", file=sys.stderr, flush=True)
    except Exception:
        pass


def _await_listener(path: str, marker: str) -> None:
    """A warm process launched a moment ago (a sandbox created for this run) listens within tens
    of milliseconds of its start: wait for it rather than run cold, within a bound."""
    deadline = time.monotonic() + STARTUP_WAIT_SEC
    while not os.path.exists(path) and os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.002)


def hand_off(phase: str, entry: str, path: str = SOCKET_PATH) -> int | None:
    """The exit status of this run served by the warm process at ``path``, or None: run cold.

    ``phase`` is ``agent`` or ``grade``; ``entry`` the bundle's entry module, whose cold function
    the warm child calls."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    except OSError:
        return None
    with sock:
        try:
            if not _offer(sock, phase, entry, path):
                return None
        except (OSError, ValueError, UnicodeError, RecursionError):
            return None  # not committed: nothing ran
        return _follow(sock)


def _offer(sock: socket.socket, phase: str, entry: str, path: str) -> bool:
    """Up to and including the commit; False (nothing committed) when the warm side says no."""
    sock.settimeout(VERDICT_TIMEOUT_SEC)
    _await_listener(path, os.path.join(os.path.dirname(path), os.path.basename(LAUNCH_MARKER)))
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError, PermissionError):
        return False  # no warm process (yet, any more, or not for this user): the ordinary case
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        request = {"protocol": PROTOCOL, "phase": phase, "entry": entry, "argv": sys.argv, "env": dict(os.environ)}
        send_frame(sock, request, fds=[0, 1, 2, cwd])
    finally:
        os.close(cwd)
    verdict, _ = recv_frame(sock)
    if verdict.get("ok") is not True:
        _note(f"the warm interpreter declined this run ({str(verdict.get('why'))[:200]}); running cold")
        return False
    send_frame(sock, {"go": True})
    return True


def _follow(sock: socket.socket) -> int:
    """Committed: forward the signals this process gets, then exit as the served run did."""
    sock.settimeout(None)

    def forward(signum: int, _frame: object) -> None:
        try:
            send_frame(sock, {"signal": signum})
        except OSError:
            pass

    for forwarded in FORWARDED_SIGNALS:
        signal.signal(forwarded, forward)
    try:
        status, _ = recv_frame(sock)
    except (OSError, ValueError, UnicodeError, RecursionError) as exc:
        _note(f"the warm-served run's status was lost ({type(exc).__name__}); failing the run")
        return EXIT_LOST
    code, killed = status.get("exit"), status.get("signal")
    if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255:
        return code
    if isinstance(killed, int) and not isinstance(killed, bool) and 0 < killed < 65:
        for forwarded in FORWARDED_SIGNALS:
            signal.signal(forwarded, signal.SIG_DFL)
        os.kill(os.getpid(), killed)  # end as the run ended: killed by that signal
        return 128 + killed
    _note("the warm-served run's status was unreadable; failing the run")
    return EXIT_LOST
