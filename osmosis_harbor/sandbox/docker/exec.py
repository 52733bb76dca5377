"""Running commands in a sandbox: ``docker exec`` with a deadline, and the handles Harbor waits on.

Split from the facade because exec is the one part with its own concurrency: each running
command holds an executor thread while its output streams in, one shared timer thread watches
every deadline, and a timeout SIGKILLs the command's whole session from the host (runc makes
every exec a session leader; the engine runs on this machine) and reports 124 like
``timeout(1)``. The facade's ``Launcher`` starts the exec (``_launch``); everything after
that lives here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import heapq
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import docker.errors
from docker import APIClient

from osmosis_harbor.sandbox.docker.config import DockerConfig
from osmosis_harbor.sandbox.docker.output import OutputTail
from osmosis_harbor.sandbox.sdk.calls import executor, run_blocking

log = logging.getLogger(__name__)

MAX_EXEC_TIMEOUT_SEC = 3600
TIMEOUT_EXIT_CODE = 124
# After a timeout kill, give the output stream this long to drain before abandoning it (a
# daemonised grandchild can keep the pipe open; the caller must still get its 124).
KILL_GRACE_SEC = 5.0


# ── deadlines ────────────────────────────────────────────────────────────────────────────────


class Deadlines:
    """One timer thread for all exec timeouts (a thread per exec would double the threads).

    A fired callback gets a short-lived thread of its own, not an executor slot: when every
    executor thread is busy draining a running command, the kill that frees one must still run.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, list[Any]]] = []
        self._cond = threading.Condition()
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, delay: float, callback: Callable[[], None]) -> list[Any]:
        """Returns a token for `cancel`."""
        entry: list[Any] = [callback, False]
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._counter), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="osmosis-docker-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
        return entry

    @staticmethod
    def cancel(entry: list[Any]) -> None:
        """Drop the callback too: the entry stays queued until its time, its exec's output need not."""
        entry[1] = True
        entry[0] = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                when, _, entry = self._heap[0]
                wait = when - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            callback = entry[0]
            if not entry[1] and callback is not None:
                threading.Thread(
                    target=self._fire, args=(callback,), name="osmosis-docker-timeout", daemon=True
                ).start()

    @staticmethod
    def _fire(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("exec timeout handling failed")


class ExecEngine(Protocol):
    """What a running command needs of the engine: its API client, the deadline timer and the
    config (the output bound)."""

    api: APIClient
    deadlines: Deadlines
    config: DockerConfig


class Launcher(Protocol):
    """A sandbox that can start a command (``DockerSandbox.launch``)."""

    def launch(
        self,
        argv: Sequence[str],
        workdir: str | None,
        timeout_seconds: float | None,
        env: Mapping[str, str] | None,
    ) -> ExecRun: ...


# ── exec ─────────────────────────────────────────────────────────────────────────────────────


def _proc_stat(pid_dir: Path) -> tuple[int, int] | None:
    """(process group, session) of a /proc entry, or None if it vanished."""
    try:
        fields = (pid_dir / "stat").read_text().rsplit(")", 1)[-1].split()
        return int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None


def _kill_session(leader_pid: int, container_id: str) -> bool:
    """SIGKILL every process in the exec's session (its group and any group it made).

    ``leader_pid`` is the host pid the engine reports. Guarded so a pid from another pid
    namespace (remote engine) can never hit an unrelated local process: the leader must sit in
    this container's cgroup, and victims must share its pid namespace.
    """
    leader = Path("/proc") / str(leader_pid)
    try:
        if container_id not in (leader / "cgroup").read_text():
            return False
        pid_ns = os.readlink(leader / "ns" / "pid")
    except OSError:
        return False
    killed = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        ids = _proc_stat(entry)
        if ids is None or leader_pid not in ids:
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != pid_ns:
                continue
            os.kill(int(entry.name), signal.SIGKILL)
            killed = True
        except (OSError, ProcessLookupError):
            continue
    return killed


class ExecRun:
    """One running command: its output buffers, its deadline and its exit code future."""

    def __init__(self, engine: ExecEngine, container_id: str, exec_id: str, stream: Any, timeout: float) -> None:
        self._engine = engine
        self._container_id = container_id
        self._exec_id = exec_id
        self._stream = stream
        limit = engine.config.exec_output_max_bytes
        self.stdout = OutputTail("stdout", limit)
        self.stderr = OutputTail("stderr", limit)
        self.timed_out = False
        self._deadline: list[Any] | None = None
        self._grace: list[Any] | None = None
        self.future: concurrent.futures.Future[int] = executor().submit(self._drain)
        self._deadline = engine.deadlines.schedule(timeout, self._on_timeout)

    def _drain(self) -> int:
        try:
            for out, err in self._stream:
                if out:
                    self.stdout.append(out)
                if err:
                    self.stderr.append(err)
        except (OSError, ValueError) as exc:  # stream closed under us after a timeout
            if not self.timed_out:
                raise
            log.debug("exec stream closed after timeout: %s", exc)
        finally:
            for token in (self._deadline, self._grace):
                if token is not None:
                    self._engine.deadlines.cancel(token)
            self._stream.close()
        return TIMEOUT_EXIT_CODE if self.timed_out else self._exit_code()

    def _exit_code(self) -> int:
        """The stream can end a moment before the engine records the exit code: poll briefly."""
        deadline = time.monotonic() + 10.0
        delay = 0.002
        while True:
            info = self._engine.api.exec_inspect(self._exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else -1
            if time.monotonic() > deadline:
                raise TimeoutError(f"exec {self._exec_id[:12]} output ended but it still runs")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _on_timeout(self) -> None:
        if self.future.done():  # finished while the timer fired
            return
        self.timed_out = True
        self.kill()
        self._grace = self._engine.deadlines.schedule(KILL_GRACE_SEC, self._abandon_stream)

    def kill(self) -> None:
        try:
            info = self._engine.api.exec_inspect(self._exec_id)
        except docker.errors.APIError:
            return
        if info.get("Running") and info.get("Pid") and not _kill_session(int(info["Pid"]), self._container_id):
            log.warning("cannot kill exec %s from the host (remote engine?)", self._exec_id[:12])

    def _abandon_stream(self) -> None:
        if not self.future.done():
            log.warning("exec %s output still open %ss after kill; closing it", self._exec_id[:12], KILL_GRACE_SEC)
            self._stream.close()


class OutputStream:
    """``handle.stdout`` / ``handle.stderr``: ``read()`` returns the output as text (its
    last ``Settings.exec_output_max_bytes``, see ``output.py``)."""

    def __init__(self, run: ExecRun, which: str) -> None:
        self._run = run
        self._which = which

    def read_bytes(self) -> bytes:
        self._run.future.result()
        tail: OutputTail = getattr(self._run, self._which)
        return tail.value()

    def read(self) -> str:
        """Blocks until the command ends (immediate after ``wait()``)."""
        return self.read_bytes().decode("utf-8", errors="replace")


class _HandleBase:
    def __init__(self, run: ExecRun) -> None:
        self._run = run
        self.stdout = OutputStream(run, "stdout")
        self.stderr = OutputStream(run, "stderr")

    @property
    def returncode(self) -> int | None:
        future = self._run.future
        return future.result() if future.done() else None

    @property
    def timed_out(self) -> bool:
        return self._run.timed_out

    def kill(self) -> None:
        """Kill the command's whole session now (not reported as a timeout)."""
        self._run.kill()


class ExecHandle(_HandleBase):
    """Returned by the blocking ``sandbox.exec(...)``: ``wait()`` blocks."""

    def wait(self, timeout: float | None = None) -> int:
        return self._run.future.result(timeout)


class AsyncExecHandle(_HandleBase):
    """Returned by ``await sandbox.exec.aio(...)``: ``await handle.wait()`` (what Harbor does)."""

    async def wait(self, timeout: float | None = None) -> int:
        """The exit code; ``timeout``: give up waiting (``TimeoutError``) after that long."""
        waiting = asyncio.wrap_future(self._run.future)
        return await (waiting if timeout is None else asyncio.wait_for(asyncio.shield(waiting), timeout))


class ExecMethod:
    """``sandbox.exec(*argv, ...)`` and ``await sandbox.exec.aio(*argv, ...)``."""

    def __init__(self, sandbox: Launcher) -> None:
        self._sandbox = sandbox

    def __call__(
        self,
        *argv: str,
        workdir: str | None = None,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecHandle:
        return ExecHandle(self._sandbox.launch(argv, workdir, timeout_seconds, env))

    async def aio(
        self,
        *argv: str,
        workdir: str | None = None,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncExecHandle:
        launch = functools.partial(self._sandbox.launch, argv, workdir, timeout_seconds, env)
        run = await run_blocking(launch, on_abandon=lambda r: r.kill())
        return AsyncExecHandle(run)


def exec_timeout(timeout_seconds: float | None) -> float:
    """Default and ceiling are SkyPilot's server-side cap; larger values are clamped like it."""
    if timeout_seconds is None:
        return float(MAX_EXEC_TIMEOUT_SEC)
    if timeout_seconds <= 0:
        raise ValueError("timeout_seconds must be positive")
    return float(min(timeout_seconds, MAX_EXEC_TIMEOUT_SEC))


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise ValueError(f"invalid environment entry {key!r}: keys and values must be strings, keys without '='")
    return dict(env)
