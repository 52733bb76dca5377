"""A fake sandbox's handle: exec (a handle to ``wait()`` on), the file calls, the archive
calls, terminate; each a blocking call with its ``.aio`` twin, each recorded on its cloud."""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .commands import BUILTINS
from .errors import InvalidRequest, NotFound
from .interpreter import Process, ShellExit, run_argv
from .tree import Dir, Tree, TreeError
from .twins import Twin

if TYPE_CHECKING:
    from .cloud import FakeSky

__all__ = ["DEFAULT_EXEC_TIMEOUT_SEC", "MAX_EXEC_TIMEOUT_SEC", "TIMEOUT_EXIT_CODE", "ExecHandle", "FakeSandbox"]

DEFAULT_EXEC_TIMEOUT_SEC = 60  # SkyPilot's server-side default
MAX_EXEC_TIMEOUT_SEC = 3600  # SkyPilot's cap: more is refused, not clamped
TIMEOUT_EXIT_CODE = 124  # what the local SDKs report for a command killed at its timeout


@dataclass
class Output:
    """``handle.stdout`` / ``handle.stderr``: ``read()`` gives what the command wrote."""

    buffer: bytearray

    def read(self) -> str:
        return bytes(self.buffer).decode("utf-8", errors="replace")


class ExecHandle:
    """A command started in a fake sandbox: ``await handle.wait()``, then read its output."""

    def __init__(self, sandbox: FakeSandbox, task: asyncio.Task[int | None], proc: Process) -> None:
        self._sandbox, self._task = sandbox, task
        self.stdout, self.stderr = Output(proc.out), Output(proc.err)

    async def wait(self, timeout: float | None = None) -> int:
        """The exit code; a wait cut short leaves the command running, as SkyPilot's polling does.
        A command whose sandbox went away under it raises "not found"."""
        try:
            code = await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not self._task.cancelled() or (current is not None and current.cancelling()):
                raise  # the wait itself was cancelled: the command runs on
            code = None  # cancelled before it started: its sandbox went away
        if code is None:
            raise NotFound(f"sandbox {self._sandbox.name!r} was terminated or lost while the command ran")
        return code


class DoneHandle:
    """The blocking twin's handle: the command has finished when ``exec`` returns."""

    def __init__(self, code: int, out: bytearray, err: bytearray) -> None:
        self._code, self.stdout, self.stderr = code, Output(out), Output(err)

    def wait(self, timeout: float | None = None) -> int:
        return self._code


class FakeSandbox:
    """One live sandbox of a `FakeSky`."""

    def __init__(
        self, cloud: FakeSky, name: str, tree: Tree, env: dict[str, str], *, workdir: str, pool: str | None
    ) -> None:
        self._cloud, self._name, self.tree, self.env = cloud, name, tree, env
        self.workdir, self.pool = workdir, pool
        self.status: str | None = "RUNNING"  # None: gone (terminated, or lost without a trace)
        self.status_message: str | None = None
        self._running: set[asyncio.Task[int | None]] = set()
        self.exec = Twin(self._exec, blocking=self._exec_blocking)
        self.write_bytes = Twin(self._write_bytes)
        self.read_bytes = Twin(self._read_bytes)
        self.put_archive = Twin(self._put_archive)
        self.get_archive = Twin(self._get_archive)
        self.terminate = Twin(self._terminate)

    @property
    def name(self) -> str:
        return self._name

    @property
    def live(self) -> bool:
        return self.status == "RUNNING"

    def _enter(self, call: str, *args: Any, **kwargs: Any) -> None:
        self._cloud.record(call, self._name, args, kwargs)
        self._cloud.faults.check(call, self._name)
        if not self.live:
            raise NotFound(f"sandbox {self._name!r} not found (terminated, expired or evicted)")

    # ── exec ──────────────────────────────────────────────────────────────────────

    def _start(
        self, argv: Sequence[str], workdir: str | None, timeout_seconds: float | None, env: dict[str, str] | None
    ) -> tuple[Process, float]:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidRequest(f"exec needs a non-empty argv of strings, got {list(argv)!r}")
        timeout = DEFAULT_EXEC_TIMEOUT_SEC if timeout_seconds is None else timeout_seconds
        if not 0 < timeout <= MAX_EXEC_TIMEOUT_SEC:
            raise InvalidRequest(f"timeout_seconds {timeout} is not in (0, {MAX_EXEC_TIMEOUT_SEC}]")
        proc = Process(self.tree, {**self.env, **(env or {})}, workdir or self.workdir, BUILTINS)
        return proc, float(timeout)

    async def _exec(
        self,
        *argv: str,
        workdir: str | None = None,
        timeout_seconds: float | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecHandle:
        self._enter("exec", *argv, workdir=workdir, timeout_seconds=timeout_seconds, env=env)
        proc, timeout = self._start(argv, workdir, timeout_seconds, env)
        if self._cloud.faults.exec_delay:
            await asyncio.sleep(self._cloud.faults.exec_delay)
        task = asyncio.get_running_loop().create_task(self._run(proc, list(argv), timeout))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        loss = self._cloud.faults.loss_for(self._name, argv)
        if loss is not None:
            await asyncio.sleep(0)  # the command has started when its pod goes
            self._cloud.lose(self._name, status=loss.status, message=loss.message)
        return ExecHandle(self, task, proc)

    def _exec_blocking(self, *argv: str, **kwargs: Any) -> DoneHandle:
        async def run() -> DoneHandle:
            handle = await self._exec(*argv, **kwargs)
            code = await handle.wait()
            return DoneHandle(code, bytearray(handle.stdout.read().encode()), bytearray(handle.stderr.read().encode()))

        return asyncio.run(run())

    async def _run(self, proc: Process, argv: list[str], timeout: float) -> int | None:
        """The command's exit code; None when its sandbox went away under it."""
        try:
            return await asyncio.wait_for(self._interpret(proc, argv), timeout)
        except TimeoutError:
            proc.err += f"the command was killed at its timeout ({timeout:g} s)\n".encode()
            return TIMEOUT_EXIT_CODE
        except asyncio.CancelledError:
            if not self.live:
                return None
            raise

    async def _interpret(self, proc: Process, argv: list[str]) -> int:
        if not isinstance(self.tree.get(proc.cwd), Dir):
            proc.complain(f"sh: cd: {proc.cwd}: No such file or directory\n")  # SkyPilot's ``cd``, verified live
            return 127
        try:
            return await run_argv(proc, argv)
        except ShellExit as done:
            return done.code

    def went_away(self, status: str | None, message: str | None) -> None:
        """Terminated or lost: every running command ends (its ``wait()`` raises "not found")."""
        self.status, self.status_message = status, message
        for task in list(self._running):
            task.cancel()

    # ── files ─────────────────────────────────────────────────────────────────────

    def _tree_call(self, path: str, action: Any) -> Any:
        if not posixpath.isabs(path):
            raise InvalidRequest(f"{path!r} is not an absolute path")
        try:
            return action()
        except TreeError as exc:
            if exc.reason == "ENOENT":
                raise NotFound(f"{path}: No such file or directory") from None
            raise InvalidRequest(str(exc)) from None

    async def _write_bytes(self, data: bytes, path: str) -> None:
        self._enter("write_bytes", len(data), path)
        self._tree_call(path, lambda: self.tree.write(path, bytes(data)))

    async def _read_bytes(self, path: str) -> bytes:
        self._enter("read_bytes", path)
        return bytes(self._tree_call(path, lambda: self.tree.read(path)))

    async def _put_archive(self, data: bytes, directory: str) -> None:
        self._enter("put_archive", len(data), directory)
        self._tree_call(directory, lambda: self.tree.unpack(bytes(data), directory))

    async def _get_archive(self, path: str) -> bytes:
        self._enter("get_archive", path)
        arcname = posixpath.basename(path.rstrip("/")) or "."
        return bytes(self._tree_call(path, lambda: self.tree.pack([(path, arcname)])))

    async def _terminate(self, wait: bool = True) -> None:
        """Idempotent, as SkyPilot's: terminating a gone sandbox is not an error."""
        self._cloud.record("terminate", self._name, (), {"wait": wait})
        self._cloud.faults.check("terminate", self._name)
        self._cloud.remove(self._name)
