"""The handles the skypilot-emulator SDK returns: a sandbox, and a running command.

A sandbox handle offers what SkyPilot's does (``exec``, ``write_bytes``, ``read_bytes``,
``write_text``, ``read_text``, ``terminate``, ``snapshot``, each with ``.aio``; a context
manager) and deliberately nothing more: no ``put_archive`` / ``get_archive``, so directories move
as SkyPilot's calls allow. ``ls()`` returns handles too, as SkyPilot's does: each carries the
record it was listed with (``_record``: name, status, image, ``template_name`` for its pool).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote

from osmosis_harbor.sandbox.emulator.client.http import session
from osmosis_harbor.sandbox.emulator.wire import (
    DEFAULT_EXEC_TIMEOUT_SEC,
    ExecRequest,
    ExecResult,
    ExecStarted,
    SandboxInfo,
    SnapshotResult,
)
from osmosis_harbor.sandbox.sdk.calls import dual, run_blocking

__all__ = ["AsyncExecHandle", "EmulatorSandbox", "ExecHandle"]


class _Run:
    """One command on the server: its id, and its result once fetched (fetched once)."""

    def __init__(self, exec_id: str, timeout: float) -> None:
        self._exec_id = exec_id
        self._timeout = timeout
        self._lock = threading.Lock()
        self._result: ExecResult | None = None

    def result(self, wait_timeout: float | None = None) -> ExecResult:
        """The result, fetched once. ``wait_timeout``: how long to wait for it (default: the
        command's own timeout plus the API's); past it the call fails and may be made again."""
        with self._lock:
            if self._result is None:
                if wait_timeout is None:
                    response = session().call("GET", f"/execs/{self._exec_id}", extra_timeout=self._timeout)
                else:
                    response = session().call("GET", f"/execs/{self._exec_id}", timeout=wait_timeout)
                self._result = ExecResult.model_validate_json(response.content)
            return self._result


class OutputStream:
    """``handle.stdout`` / ``handle.stderr``: ``read()`` returns the whole output as text."""

    def __init__(self, run: _Run, which: str) -> None:
        self._run = run
        self._which = which

    def read_bytes(self) -> bytes:
        result = self._run.result()
        return base64.b64decode(result.stdout_b64 if self._which == "stdout" else result.stderr_b64)

    def read(self) -> str:
        """Blocks until the command ends (immediate after ``wait()``)."""
        return self.read_bytes().decode("utf-8", errors="replace")


class _HandleBase:
    def __init__(self, run: _Run) -> None:
        self._run = run
        self.stdout = OutputStream(run, "stdout")
        self.stderr = OutputStream(run, "stderr")


class ExecHandle(_HandleBase):
    """Returned by the blocking ``sandbox.exec(...)``: ``wait(timeout=)`` blocks for the exit code."""

    def wait(self, timeout: float | None = None) -> int:
        return self._run.result(timeout).exit_code


class AsyncExecHandle(_HandleBase):
    """Returned by ``await sandbox.exec.aio(...)``: ``await handle.wait(timeout=)``."""

    async def wait(self, timeout: float | None = None) -> int:
        return (await run_blocking(lambda: self._run.result(timeout))).exit_code


class ExecMethod:
    """``sandbox.exec(*argv, workdir=, timeout_seconds=, env=)`` and its ``.aio`` twin."""

    def __init__(self, sandbox: EmulatorSandbox) -> None:
        self._sandbox = sandbox

    def _start(
        self, argv: tuple[str, ...], workdir: str | None, timeout_seconds: float | None, env: Mapping[str, str] | None
    ) -> _Run:
        request = ExecRequest(argv=list(argv), workdir=workdir, env=dict(env or {}), timeout_seconds=timeout_seconds)
        response = session().call("POST", f"{self._sandbox.path}/exec", json=request.model_dump(mode="json"))
        started = ExecStarted.model_validate_json(response.content)
        return _Run(started.exec_id, float(timeout_seconds or DEFAULT_EXEC_TIMEOUT_SEC))

    def __call__(
        self,
        *argv: str,
        workdir: str | None = None,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecHandle:
        return ExecHandle(self._start(argv, workdir, timeout_seconds, env))

    async def aio(
        self,
        *argv: str,
        workdir: str | None = None,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncExecHandle:
        return AsyncExecHandle(await run_blocking(lambda: self._start(argv, workdir, timeout_seconds, env)))


class EmulatorSandbox:
    """A live sandbox on the emulator server (or its ``ls()`` record)."""

    def __init__(self, info: SandboxInfo) -> None:
        self._info = info
        self._record = {
            "name": info.name,
            "status": info.status,
            "image": info.image,
            "template_name": info.pool,
            "created_at": info.created_at,
            "expires_at": info.expires_at,
            "status_message": info.status_message,  # the pod's reason where it stopped (an eviction)
        }

    def __repr__(self) -> str:
        return f"EmulatorSandbox(name={self.name!r}, image={self._info.image!r}, pool={self._info.pool!r})"

    @property
    def name(self) -> str:
        return self._info.name

    @property
    def image(self) -> str:
        return self._info.image

    @property
    def pool(self) -> str | None:
        return self._info.pool

    @property
    def status(self) -> str:
        """The status it had when it was listed or made (``RUNNING``, ...)."""
        return self._info.status

    @property
    def endpoints(self) -> dict[str, str]:
        return dict(self._info.endpoints)

    @property
    def path(self) -> str:
        return f"/sandboxes/{quote(self.name, safe='')}"

    @property
    def exec(self) -> ExecMethod:
        return ExecMethod(self)

    @dual
    def write_bytes(self, data: bytes | bytearray | memoryview, path: str) -> None:
        """Write ``data`` to the absolute ``path``; its directory must exist (no implicit
        parents: `RemoteFileNotFoundError`, as SkyPilot's examples ``mkdir -p`` first)."""
        session().call("PUT", f"{self.path}/files", params={"path": path}, content=bytes(data))

    @dual
    def read_bytes(self, path: str) -> bytes:
        """A regular file's bytes; a missing path raises `RemoteFileNotFoundError` (404), a
        directory `RemoteIsADirectoryError` (400)."""
        return session().call("GET", f"{self.path}/files", params={"path": path}).content

    @dual
    def write_text(self, text: str, path: str) -> None:
        """``write_bytes`` of ``text`` encoded as UTF-8."""
        self.write_bytes(text.encode("utf-8"), path)

    @dual
    def read_text(self, path: str) -> str:
        """``read_bytes`` decoded as UTF-8 (undecodable bytes replaced)."""
        return self.read_bytes(path).decode("utf-8", errors="replace")

    @dual
    def terminate(self, wait: bool = True) -> None:
        """Terminate the sandbox (idempotent). ``wait`` is accepted for SkyPilot's signature:
        the server answers once the sandbox is gone."""
        session().call("DELETE", self.path)

    @dual
    def snapshot(self) -> str:
        """The sandbox's filesystem, pushed to the emulator's registry; returns the image reference."""
        response = session().call("POST", f"{self.path}/snapshot")
        return SnapshotResult.model_validate_json(response.content).image

    def __enter__(self) -> EmulatorSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    async def __aenter__(self) -> EmulatorSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.terminate.aio()


def sandboxes_from(payload: Any) -> list[EmulatorSandbox]:
    return [EmulatorSandbox(SandboxInfo.model_validate(item)) for item in payload]
