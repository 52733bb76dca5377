"""Which way this environment's files go: as archives made of one file call plus one command
(``transfer/exec_archives.py``), folded into the commands around them (``exec_folds.py``): SkyPilot's
path, on every SDK by default, so a local run moves its files exactly as SkyPilot's does; or, with
``exec_archives`` off, by Harbor's own transfer commands.

Uploads on the archive routes are written behind (``transfer/archives.py``): every command sees
the uploads made before it, and may change anything it can reach, except Harbor's preparation
commands, which touch only their own paths (``preparation.py``).

The router alone holds what is staged (the archive transfers) and which dirs are known ready
(existing, empty and 0777: ``preparation.py`` elides Harbor's commands on them); everyone else
asks it, or tells it what changed.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harbor.environments.base import ExecResult
from harbor.environments.tar_transfer import pack_dir_to_bytes, remote_unpack_command

from osmosis_harbor.harbor_compat.skypilot_names import MAX_EXEC_TIMEOUT_SEC, REMOTE_TRANSFER_DIR
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.transfer.archives import ArchiveTransfers, overlaps
from osmosis_harbor.sandbox.transfer.downloads import HarborPath
from osmosis_harbor.sandbox.transfer.exec_archives import ExecArchives, ReadBytes, WriteBytes
from osmosis_harbor.sandbox.transfer.exec_folds import (
    FoldedPack,
    UploadFold,
    fold_argv,
    is_verifier_test_command,
    read_trailer,
    upload_failure,
)
from osmosis_harbor.sandbox.transfer.extract import TransferLimits
from osmosis_harbor.settings import Settings

__all__ = ["CommandFold", "FileCalls", "TransferRoutes", "takes_exec_archives"]

# The pack after a command runs within the command's exec: its time is added to the exec's
# timeout (up to SkyPilot's cap), so it never makes a command that finished in time time out.
PACK_ALLOWANCE_SEC = 30


@dataclass(frozen=True)
class CommandFold:
    """The transfers riding one command's exec (``exec_folds.py``): the upload unpacked before
    it, the ``/logs`` pack after it."""

    upload: UploadFold | None
    pack: FoldedPack | None

    def riding(self, argv: list[str], timeout_seconds: int) -> tuple[list[str], int]:
        """The argv and timeout of the exec that carries this fold."""
        return fold_argv(argv, self.upload, self.pack), min(timeout_seconds + PACK_ALLOWANCE_SEC, MAX_EXEC_TIMEOUT_SEC)


@dataclass(frozen=True)
class FileCalls:
    """The session's calls a route is made of: a raw shell command (unguarded, flushing nothing:
    Harbor's ``_run_shell`` through the exec records), and the guarded file calls."""

    raw_shell: Callable[[str, int], Awaitable[ExecResult]]  # (command, timeout_seconds)
    write_bytes: WriteBytes
    read_bytes: ReadBytes


def takes_exec_archives(sandbox: Any, current: Settings) -> bool:
    """Whether this sandbox's transfers are archives made of its own calls (``exec_archives.py``),
    whose uploads can carry Harbor's preparation of their targets (`stage_preparation`)."""
    return current.exec_archives


class TransferRoutes:
    """The route of each transfer of one environment's sandbox (see the module docstring)."""

    def __init__(
        self,
        state: EnvironmentState,
        guarded: Callable[[Awaitable[Any]], Awaitable[Any]],
        calls: FileCalls,
        logger: logging.Logger,
        current: Settings,
        companions: tuple[str, ...] = (),
        *,
        fresh_verifier: bool = False,
    ) -> None:
        # Uploads ride the verifier's test command only in a separate verifier's sandbox, where
        # no process of the workflow ever ran (``exec_folds.py``).
        self._fresh_verifier = fresh_verifier
        self._exec_archives: ExecArchives | None = None
        self._transfers: ArchiveTransfers | None = None  # what is staged, once a route is taken
        self._ready: set[str] = set()  # dirs known to exist, empty and 0777
        self._scope: list[str] | None = None  # the paths the running preparation command touches
        self._logs_follow: str | None = None  # the command after which Harbor reads /logs
        self._companions = companions  # trees read after /logs, fetched with it (``ArchiveTransfers``)
        self._state = state
        self._guarded = guarded
        self._calls = calls
        self._logger = logger
        self._settings = current
        self.limits = TransferLimits.of(current)  # every transfer of this environment's sandboxes

    # ── what is known ready (``preparation.py`` elides Harbor's commands on it) ──────────────

    def started(self, ready: frozenset[str]) -> None:
        """A sandbox was created or claimed: nothing staged yet, ``ready`` known ready."""
        self._transfers, self._exec_archives, self._ready = None, None, set(ready)

    def is_ready(self, path: str) -> bool:
        return path in self._ready

    def mark_ready(self, dirs: Sequence[Any]) -> None:
        """``dirs`` exist, are empty and 0777 (Harbor's emptying, or the guard's check, left them so)."""
        self._ready.update(str(d) for d in dirs)

    def forget_ready(self, paths: Sequence[Any] | None) -> None:
        """Something changed at ``paths`` (anywhere, when None): the known-ready dirs there
        are known no more."""
        if paths is None:
            self._ready.clear()
        else:
            self._ready = {d for d in self._ready if not any(overlaps(d, str(p)) for p in paths)}

    @contextlib.contextmanager
    def scoped(self, paths: Sequence[Any]) -> Iterator[None]:
        """Mark the commands inside as touching only ``paths`` (Harbor's dir preparation)."""
        self._scope = [str(p) for p in paths]
        try:
            yield
        finally:
            self._scope = None

    def make_executable(self, path: str) -> bool:
        """``chmod +x path`` on a file still staged: applied to the staged copy (True)."""
        return self._transfers is not None and self._transfers.make_executable(path)

    def archives(self) -> ArchiveTransfers | None:
        """The archive transfers of this sandbox: built from a file write or read plus one command
        (``exec_archives.py``); None with ``exec_archives`` off (Harbor's own transfer commands run)."""
        state = self._state
        if self._transfers is not None or state.sandbox is None:
            return self._transfers
        if takes_exec_archives(state.sandbox, self._settings):
            archives = ExecArchives(self._raw_shell, self._calls.write_bytes, self._calls.read_bytes, self.limits)
            self._exec_archives = archives
            self._transfers = ArchiveTransfers(
                archives.put,
                archives.get,
                self.limits,
                self._logger,
                get_together=archives.get_together,
                companions=self._companions,
                put_after=archives.put_after,
            )
        return self._transfers

    async def _raw_shell(self, command: str, timeout_seconds: int) -> ExecResult:
        """A command of the transfers themselves: guarded, but neither flushing the staged
        uploads nor invalidating snapshots, as every other command does (`command`)."""
        result: ExecResult = await self._guarded(self._calls.raw_shell(command, timeout_seconds))
        return result

    async def shell(self, command: str, timeout_seconds: int) -> ExecResult:
        """Harbor's raw shell command (``sh -c``, no workdir, env or user), as any command is:
        after the uploads before it, guarded."""
        async with self.command():
            return await self._raw_shell(command, timeout_seconds)

    def logs_follow(self, command: str) -> None:
        """The next exec of exactly ``command`` is followed by a read of ``/logs`` (the workflow
        agent's run): on the exec-archives route its pack rides that exec."""
        self._logs_follow = command

    @contextlib.asynccontextmanager
    async def command(self, text: str | None = None) -> AsyncIterator[CommandFold | None]:
        """A command sees every upload made before it, and may change anything it can reach;
        Harbor's preparation commands (``_prepare``) touch only their own paths. ``text``: the
        command (Harbor's exec), whose exec the transfers around it may ride (the fold yielded,
        for its exec's argv: `CommandFold.riding`; `settle` reads its result)."""
        scope = self._scope
        transfers = self.archives() if text is not None and self._logs_follow == text else self._transfers
        self.forget_ready(scope)
        if transfers is None:
            yield None
            return
        fold = await self._fold_for(text) if scope is None and text is not None else None
        if fold is None or fold.upload is None:
            await (transfers.flush() if scope is None else transfers.flush_overlapping(scope))
        transfers.command_ran(scope)
        try:
            yield fold
        finally:
            transfers.command_ran(scope)

    async def _fold_for(self, text: str) -> CommandFold | None:
        archives, transfers = self._exec_archives, self._transfers
        follows, self._logs_follow = text == self._logs_follow, None
        if archives is None or transfers is None:
            return None
        verifier = is_verifier_test_command(text)
        if not (follows or verifier):
            return None
        upload = None
        if verifier and self._fresh_verifier and (staged := transfers.take_staged()) is not None:
            upload = await self._guarded(archives.upload_fold(*staged))
        return CommandFold(upload, archives.pack_fold(transfers.fold_roots()))

    async def settle(self, fold: CommandFold | None, result: ExecResult) -> ExecResult:
        """The command's own result, after what rode its exec: a folded upload that failed
        raises, as its own unpack command would have; a pack after it is adopted as the next
        ``/logs`` fetch when its trailer holds (else the fetch runs as usual)."""
        if fold is None:
            return result
        if fold.upload is not None and (failure := upload_failure(result, fold.upload)) is not None:
            raise RuntimeError(f"Failed to prepare and unpack an upload in the sandbox: {failure}")
        if fold.pack is None:
            return result
        result, trailer = read_trailer(result, fold.pack)
        archives, transfers = self._exec_archives, self._transfers
        if archives is None or transfers is None:
            return result
        if trailer is None:
            archives.forget_pack(fold.pack)
            return result
        pack = fold.pack
        try:
            await transfers.adopt(trailer.present, lambda into: self._guarded(archives.adopt(pack, trailer, into)))
        except Exception as exc:  # doubtful: the download packs again, and fails there if it must
            self._logger.debug(f"the /logs pack after the command was not adopted ({exc}): fetching it again")
        return result

    # On Harbor's route a transfer is commands in the sandbox; each touches only the transfer's
    # target and its temp archive under Harbor's transfer dir, so it makes only those unknown
    # (``preparation.py``), not every dir known ready: a later preparation there stays elided.

    async def upload_dir(self, source: Path, target: str) -> None:
        self.forget_ready([target])
        if (transfers := self.archives()) is None:
            with self.scoped([target, REMOTE_TRANSFER_DIR]):
                return await self._harbor_upload_dir(source, target)
        transfers.stage_dir(source, target)

    async def upload_file(self, source: Path, target: str) -> None:
        self.forget_ready([target])
        if (transfers := self.archives()) is None:
            return await self._calls.write_bytes(source.read_bytes(), target)  # Harbor's: one write
        transfers.stage_file(source, target)

    async def _harbor_upload_dir(self, source: Path, target: str) -> None:
        """Harbor's directory upload: one gzipped tar written under its transfer dir, unpacked
        by one command (POSIX fidelity: modes, symlinks, empty dirs), then removed."""
        if not source.is_dir():
            raise FileNotFoundError(f"Source directory {source} does not exist")
        archive = pack_dir_to_bytes(source, compress=True).getvalue()
        remote = f"{REMOTE_TRANSFER_DIR}/hb-upload-{uuid.uuid4().hex}.tar.gz"
        await self._calls.write_bytes(archive, remote)
        try:
            result = await self.shell(remote_unpack_command(remote, target), 120)
            if result.return_code != 0:
                raise RuntimeError(f"Failed to unpack directory in SkyPilot sandbox: {result.stdout} {result.stderr}")
        finally:
            await self.shell(f"rm -f {shlex.quote(remote)}", 30)

    async def download_dir(self, source: str, target: Path) -> None:
        if (transfers := self.archives()) is None:
            with self.scoped([REMOTE_TRANSFER_DIR]):
                await self.harbor_path().download_dir(source, target)
            return
        await transfers.download_dir(source, target)

    async def download_file(self, source: str, target: Path) -> None:
        if (transfers := self.archives()) is None:
            with self.scoped([]):  # a size probe: it changes nothing
                return await self.harbor_path().download_file(source, target)
        await transfers.download_file(source, target)

    async def is_kind(self, path: str, kind: str, *, harbor: Callable[[str], Awaitable[bool]]) -> bool:
        """Whether ``path`` is a ``kind`` ("dir" or "file"), from the snapshot on the archive route."""
        if (transfers := self.archives()) is None:
            return await harbor(path)
        return await transfers.kind(path) == kind

    def stage_preparation(self, command: str, dirs: list[str]) -> bool:
        """Stage Harbor's emptying ``command`` of ``dirs`` to run with the next upload (True),
        where the route's put runs commands; else False (Harbor runs it now)."""
        transfers = self.archives()
        if transfers is None or not transfers.stages_preparations:
            return False
        self.forget_ready(dirs)
        transfers.stage_preparation(command, dirs)
        return True

    def harbor_path(self) -> HarborPath:
        """Harbor's transfer commands with our bounded host side (no archive capability)."""
        return HarborPath(self.shell, self._calls.read_bytes, self._logger, self.limits)

    def discard(self) -> None:
        """The sandbox is stopping: uploads still staged are dropped (nothing could observe them)."""
        if self._transfers is not None:
            dropped = self._transfers.discard()
            if dropped:
                self._logger.debug(f"{dropped} staged upload(s) not sent: the sandbox is stopping")
            self._transfers = None
