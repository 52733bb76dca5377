"""Which way this environment's files go: over the handle's own archive calls (the Docker SDK),
as archives made of one file call plus one command (``transfer/exec_archives.py``), or, with
``exec_archives`` off and no archive calls, by Harbor's own transfer commands.

Uploads on the archive routes are written behind (``transfer/archives.py``): every command sees
the uploads made before it, and may change anything it can reach, except Harbor's preparation
commands, which touch only their own paths (``preparation.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from harbor.environments.base import ExecResult

from osmosis_harbor import settings
from osmosis_harbor.sandbox.environment.preparation import PreparationElider
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.sdk.protocol import has_archives
from osmosis_harbor.sandbox.transfer.archives import ArchiveTransfers
from osmosis_harbor.sandbox.transfer.downloads import HarborPath, fetch_archive
from osmosis_harbor.sandbox.transfer.exec_archives import ExecArchives, ReadBytes, WriteBytes

__all__ = ["FileCalls", "TransferRoutes"]


@dataclass(frozen=True)
class FileCalls:
    """The environment's calls a route is made of: its shell command (which flushes staged
    uploads first), Harbor's own shell command (which does not), and its guarded file calls."""

    run_shell: Callable[..., Awaitable[ExecResult]]  # (command, *, timeout_seconds)
    harbor_shell: Callable[..., Awaitable[ExecResult]]  # (command, *, timeout_seconds)
    write_bytes: WriteBytes
    read_bytes: ReadBytes


class TransferRoutes:
    """The route of each transfer of one environment's sandbox (see the module docstring)."""

    def __init__(
        self,
        state: EnvironmentState,
        elider: PreparationElider,
        guarded: Callable[[Awaitable[Any]], Awaitable[Any]],
        calls: FileCalls,
        logger: logging.Logger,
    ) -> None:
        self._state = state
        self._elider = elider
        self._guarded = guarded
        self._calls = calls
        self._logger = logger

    def archives(self) -> ArchiveTransfers | None:
        """The archive transfers of this sandbox: over its handle's archive calls when it offers
        them, else built from a file write or read plus one command (``exec_archives.py``)
        unless ``exec_archives`` is off (then None: Harbor's own transfer commands run)."""
        state = self._state
        if state.archive_transfers is not None or state.sandbox is None:
            return state.archive_transfers
        if has_archives(state.sandbox):
            sandbox = state.sandbox

            async def put(data: bytes, path: str) -> None:
                await self._guarded(sandbox.put_archive.aio(data, path))

            async def get(path: str, into: BinaryIO) -> None:
                await self._guarded(fetch_archive(sandbox, path, into))

            state.archive_transfers = ArchiveTransfers(put, get, self._logger)
        elif settings.current().exec_archives:
            archives = ExecArchives(self._raw_shell, self._calls.write_bytes, self._calls.read_bytes)
            state.archive_transfers = ArchiveTransfers(archives.put, archives.get, self._logger)
        return state.archive_transfers

    async def _raw_shell(self, command: str, timeout_seconds: int) -> ExecResult:
        """A command of the transfers themselves: guarded, but neither flushing the staged
        uploads nor invalidating snapshots, as every other command does (`command`)."""
        result: ExecResult = await self._guarded(self._calls.harbor_shell(command, timeout_seconds=timeout_seconds))
        return result

    @contextlib.asynccontextmanager
    async def command(self) -> AsyncIterator[None]:
        """A command sees every upload made before it, and may change anything it can reach;
        Harbor's preparation commands (``_prepare``) touch only their own paths."""
        scope, transfers = self._state.scope, self._state.archive_transfers
        self._elider.forget_ready(scope)
        if transfers is None:
            yield
            return
        await (transfers.flush() if scope is None else transfers.flush_overlapping(scope))
        transfers.command_ran(scope)
        try:
            yield
        finally:
            transfers.command_ran(scope)

    def harbor_path(self) -> HarborPath:
        """Harbor's transfer commands with our bounded host side (no archive capability)."""
        return HarborPath(self._calls.run_shell, self._calls.read_bytes, self._logger)

    def discard(self) -> None:
        """The sandbox is stopping: uploads still staged are dropped (nothing could observe them)."""
        state = self._state
        if state.archive_transfers is not None:
            dropped = state.archive_transfers.discard()
            if dropped:
                self._logger.debug(f"{dropped} staged upload(s) not sent: the sandbox is stopping")
            state.archive_transfers = None
