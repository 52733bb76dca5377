"""One environment's sandbox session: the live handle, its name and SDK, lost / evicted /
stopping (``state.py``), loss detection around every call (``lost_sandbox.py``), and the SDK's
own calls on the handle. This is where an exec reaches the SDK: ``handle.exec.aio(*argv,
workdir=, timeout_seconds=, env=)``, as Harbor's ``SkypilotEnvironment`` makes it, and where its
result is read (``wait()``, then each stream's ``read()``)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any

from harbor.environments.base import ExecResult

from osmosis_harbor.sandbox.environment.lost_sandbox import LossGuard, missing_as_file_not_found
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.sdk.faults import retry_safe

__all__ = ["SandboxSession", "drain_stream", "exec_result"]


async def drain_stream(stream: Any) -> str | None:
    """A handle's stream as text (an SDK may answer ``read()`` in bytes, or awaitably)."""
    reader = getattr(stream, "read", None)
    if reader is None:
        return None
    data = reader()
    if inspect.isawaitable(data):
        data = await data
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode("utf-8", errors="replace")
    return data if data is not None else None


async def exec_result(handle: Any) -> ExecResult:
    """A launched exec's result: its status, then both streams (a missing status reads 0)."""
    code = await handle.wait()
    stdout = await drain_stream(getattr(handle, "stdout", None))
    stderr = await drain_stream(getattr(handle, "stderr", None))
    return ExecResult(stdout=stdout, stderr=stderr, return_code=code if code is not None else 0)


class SandboxSession:
    """The live sandbox of one environment, and the SDK calls made on it."""

    def __init__(self, state: EnvironmentState, losses: LossGuard) -> None:
        self.state = state
        self.losses = losses

    def require(self) -> Any:
        """The live handle, or the error Harbor raises before a start."""
        if self.state.sandbox is None:
            raise RuntimeError("Sandbox not found. Please start the environment first.")
        return self.state.sandbox

    async def guarded[T](self, call: Awaitable[T]) -> T:
        """``call``, a lost sandbox told apart from the workflow's own failure."""
        return await self.losses.guarded(call)

    async def launch(
        self, argv: list[str], *, workdir: str | None, timeout_seconds: int, env: dict[str, str] | None = None
    ) -> Any:
        """Launch ``argv`` and return its handle. The SDK retries transient server errors itself
        and surfaces them once its budget is spent, so nothing is retried here (the command may
        already run: ``exec_records.py`` resolves a fault)."""
        return await self.require().exec.aio(*argv, workdir=workdir, timeout_seconds=timeout_seconds, env=env)

    async def write_bytes(self, data: bytes, remote_path: str) -> None:
        await self.guarded(retry_safe("write_bytes", self.losses.retry, self._write, data, remote_path))

    async def read_bytes(self, remote_path: str) -> bytes:
        """A missing file is ``FileNotFoundError`` whatever the SDK's shape of "not found"."""
        with missing_as_file_not_found(remote_path):
            return await self.guarded(retry_safe("read_bytes", self.losses.retry, self._read, remote_path))

    async def _write(self, data: bytes, remote_path: str) -> None:
        await self.require().write_bytes.aio(data, remote_path)

    async def _read(self, remote_path: str) -> bytes:
        return bytes(await self.require().read_bytes.aio(remote_path))
