"""The warm interpreter: a Python of the bundle's venv, started with the sandbox, that has
imported ``osmosis_ai``'s rollout machinery and waits to serve exactly one phase.

Why: see ``handoff.py`` (the console scripts' half). The image's ENTRYPOINT
(``tasks/dockerfile.py``) starts ``python -P -m osmosis_harbor_shim.warm`` detached, then runs
the container's command. This process imports ahead what every run of the bundle imports, then
listens on ``handoff.SOCKET_PATH`` (in a directory of its own user's, mode 0700) and serves one
connection, whatever it is: it stops listening before it reads the request, so a second caller
finds no socket and runs cold, and no state of one run can reach another (one warm interpreter,
one run).

What is imported ahead is ``osmosis_ai`` and the shim, never the workflow's or grader's own
package: a module may read the rollout's variables (the endpoint, the key, the rollout id) when it
is imported, and those do not exist before the hand-off. The served child imports the bundle's
package after it has taken the caller's environment, exactly as a cold start would.

Serving: the caller's privileges must equal this process's (``warm_checks.peer_mismatch``), or
it is declined and runs cold. Then a child is forked, held on a pipe until the caller commits,
and runs the phase with the caller's fds, working directory, argv and environment in a session of
its own. This process relays the child's exit status, forwards the signals the caller forwards,
and, when the caller's end of the connection closes (the caller was killed: an exec timeout),
kills the child's whole session, so a warm-served run dies with its command as a cold one does.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import re
import selectors
import signal
import socket
import stat
import sys
from collections.abc import Callable
from typing import Any

from . import handoff
from .warm_checks import peer_mismatch

__all__ = ["main", "serve"]

PHASES = {"agent": "agent_cold", "grade": "grade_cold"}  # the entry module's cold function per phase
_ENTRY = re.compile(r"^_osmosis_bundle_[A-Za-z0-9_]{1,200}$")
_GO_TIMEOUT_SEC = handoff.VERDICT_TIMEOUT_SEC
PR_SET_PDEATHSIG = 1
WARM_MARK = "served=warm"  # what the served run's summary line carries (runtime.SERVED)

PeerCheck = Callable[[socket.socket], str | None]


def preload() -> None:
    """What every phase imports, and nothing of the bundle's own package (see the module doc)."""
    importlib.import_module("osmosis_ai.rollout")
    for name in ("agent", "verifier", "atif", "runtime", "files", "loading", "errors"):
        importlib.import_module(f"{__package__}.{name}")


def listen(path: str) -> socket.socket | None:
    """The listening socket, or None when its directory is not this user's alone (then no warm
    run: a socket another user could replace must not be trusted by callers)."""
    directory = os.path.dirname(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.bind(path)
    sock.listen(1)
    with contextlib.suppress(OSError):  # listening: a caller no longer waits for the socket to appear
        os.unlink(os.path.join(directory, os.path.basename(handoff.LAUNCH_MARKER)))
    return sock


def serve(listener: socket.socket, path: str, *, check: PeerCheck = peer_mismatch) -> None:
    """Serve one connection of ``listener`` (bound at ``path``) and return. ``check`` is
    ``peer_mismatch`` in the product; tests pass another only to show what the check prevents."""
    with listener:
        conn, _ = listener.accept()
    with contextlib.suppress(OSError):
        os.unlink(path)  # before anything else: the next caller finds no socket
    with conn:
        conn.settimeout(_GO_TIMEOUT_SEC)
        try:
            request, fds = handoff.recv_frame(conn, max_fds=4)
        except (OSError, ValueError, UnicodeError, RecursionError):
            return
        try:
            _answer(conn, request, fds, check)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _refusal(request: dict[str, Any], fds: list[int]) -> str | None:
    if request.get("protocol") != handoff.PROTOCOL:
        return f"protocol {request.get('protocol')!r}, this interpreter speaks {handoff.PROTOCOL}"
    if request.get("phase") not in PHASES or not _ENTRY.match(str(request.get("entry"))):
        return "an unknown phase or entry module"
    argv, env = request.get("argv"), request.get("env")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return "no argv"
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "no environment"
    if any("=" in k or "\0" in k or "\0" in v for k, v in env.items()) or any("\0" in a for a in argv):
        return "an environment or argv the kernel would refuse"
    if len(fds) != 4:
        return "not the four file descriptors (stdin, stdout, stderr, the working directory)"
    return None


def _answer(conn: socket.socket, request: dict[str, Any], fds: list[int], check: PeerCheck) -> None:
    why = _refusal(request, fds) or check(conn)
    if why is not None:
        with contextlib.suppress(OSError):
            handoff.send_frame(conn, {"ok": False, "why": why})
        return
    hold_r, hold_w = os.pipe2(os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, which never returns
        os.close(hold_w)
        _child(request, fds, hold_r, conn)
    os.close(hold_r)
    try:
        handoff.send_frame(conn, {"ok": True, "pid": child})
        go, _ = handoff.recv_frame(conn)
        committed = go.get("go") is True
    except (OSError, ValueError, UnicodeError, RecursionError):
        committed = False
    if not committed:  # the caller runs cold: this child never runs
        os.close(hold_w)
        _reap(child)
        return
    conn.settimeout(None)
    os.write(hold_w, b"g")
    os.close(hold_w)
    _relay(conn, child)


def _child(request: dict[str, Any], fds: list[int], hold: int, conn: socket.socket) -> None:  # pragma: no cover
    """The served run: wait to be released, become the caller's process, run the cold path."""
    code = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        conn.close()
        if os.read(hold, 1) != b"g":  # the warm process went away or the caller ran cold
            os._exit(0)
        os.close(hold)
        os.setsid()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.fchdir(fds[3])
        for fd in fds:
            os.close(fd)
        # A background command of sh ignores SIGINT and SIGQUIT; a cold run does not.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        from . import runtime

        runtime.SERVED = WARM_MARK
        module = importlib.import_module(request["entry"])
        code = int(getattr(module, PHASES[request["phase"]])())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the phase records its own failures; this is a last resort
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _relay(conn: socket.socket, child: int) -> None:
    """Until the child ends: forward the caller's signals; the caller gone -> kill the run."""
    pidfd = os.pidfd_open(child)
    with selectors.DefaultSelector() as sel, contextlib.closing(os.fdopen(pidfd, "rb", buffering=0)):
        sel.register(pidfd, selectors.EVENT_READ, "child")
        sel.register(conn, selectors.EVENT_READ, "caller")
        while True:
            kinds = {key.data for key, _ in sel.select()}
            if "child" in kinds:
                break
            try:
                message, _ = handoff.recv_frame(conn)
            except (OSError, ValueError, UnicodeError, RecursionError):
                _kill_session(child)  # the caller was killed (or talks nonsense): so is its run
                _reap(child)
                return
            if message.get("signal") in handoff.FORWARDED_SIGNALS:
                with contextlib.suppress(OSError):
                    os.kill(child, int(message["signal"]))
    status = _reap(child)
    reply = {"exit": os.waitstatus_to_exitcode(status)}
    if os.WIFSIGNALED(status):
        reply = {"signal": os.WTERMSIG(status)}
    with contextlib.suppress(OSError):
        handoff.send_frame(conn, reply)


def _reap(child: int) -> int:
    _, status = os.waitpid(child, 0)
    return status


def _kill_session(leader: int) -> None:
    """SIGKILL every process of the run's session (the child made it), as an exec timeout kills
    a cold run's. The session's processes are found in /proc, which this process shares."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if int(fields[3]) == leader or int(entry) == leader:  # field 6 of stat: the session id
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def main() -> int:
    """``python -P -m osmosis_harbor_shim.warm``: listen, preload, serve one run, exit. Never
    raises: a warm interpreter that fails leaves callers to run cold.

    It listens before it preloads: a run that starts while the import is still under way (a
    sandbox created for it a moment ago) connects and waits for the rest of an import that began
    with the sandbox, rather than starting one of its own from nothing."""
    with contextlib.suppress(BaseException):
        os.setsid()
    try:
        listener = listen(handoff.SOCKET_PATH)
        if listener is None:
            return 1
        preload()
        serve(listener, handoff.SOCKET_PATH)
    except BaseException:  # noqa: BLE001 - no socket, or no run: callers run cold
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
