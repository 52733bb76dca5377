"""Moving trees in and out of a sandbox in as few calls as possible (the archive capability).

Each sandbox call is a round trip to the SkyPilot API server, and Harbor's trial moves files
in small steps: ``/logs/agent`` down, the same directory back up (for environments that do
not mount it), a ``test -d`` probe and a download of ``/logs/artifacts``, and per directory
three calls (write + unpack exec + rm exec, or pack exec + read + rm exec). With an SDK whose
sandboxes offer ``put_archive`` / ``get_archive`` (`protocol.ArchiveSandbox`) this module
makes that:

* one call per transfer, and fewer transfers:
* **uploads are written behind.** An upload is staged (packed at once, so later host changes
  do not leak in) and sent, together with every other staged upload, in one ``put_archive``
  just before the next command runs or an overlapping path is read. A sandbox stopped with
  uploads still staged never needed them: nothing could have observed them.
* **reads of Harbor's log tree share one snapshot.** The first read under ``/logs`` fetches
  ``/logs`` whole; later reads under it (the artifacts probe and download) are answered from
  that snapshot, with the uploads staged or sent since laid over it (their content is known),
  until a command runs. Where the transfers can fetch several trees in one archive
  (``GetTogether``), the trees the trial will read next (``companions``: a task's declared
  artifacts, such as the agent's working directory) come in the same fetch.

Fetched trees are streamed to a host temp file, bounded (``Settings.transfer_*``), and
extracted by our own extractor (``sandbox/extract``: never ``tarfile.extract*``; what a
hostile sandbox can put in an archive is dropped and named in the trial's log), off the
event loop (``snapshot.py``). A symlink where a directory was asked for is not followed. Uploaded entries arrive owned by root with
the modes they have on the host; a target directory that already exists keeps its own mode
and owner (Harbor's ``tar -x`` of ``.`` would reset them).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from osmosis_harbor.sandbox.transfer.extract import TransferLimits
from osmosis_harbor.sandbox.transfer.snapshot import Logger, Member, Snapshot

__all__ = ["LOG_ROOT", "ArchiveTransfers", "overlaps"]

LOG_ROOT = "/logs"  # Harbor's in-sandbox log tree: agent/, verifier/, artifacts/

Put = Callable[[bytes, str], Awaitable[None]]
# Write the tar of a sandbox path into a host file (bounded: ``TransferLimits.max_archive_bytes``).
Get = Callable[[str, BinaryIO], Awaitable[None]]
# ``Put`` after a shell prefix in the same command (the prefix's failure fails the put);
# ``data`` None: only the prefix runs.
PutAfter = Callable[[bytes | None, str, str], Awaitable[None]]
# The same for several paths in one archive, members named from ``/``; returns the paths that
# were there (a missing first path is ``FileNotFoundError``, a missing other one is left out).
GetTogether = Callable[[list[str], BinaryIO], Awaitable[list[str]]]
log = logging.getLogger(__name__)


def _norm(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"sandbox paths must be absolute, got {path!r}")
    return posixpath.normpath(path).replace("//", "/")


def overlaps(a: str, b: str) -> bool:
    """One path is the other or lies under it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


class _Staged:
    """Uploads waiting for the next command: tar members rooted at ``/``, packed when staged;
    and the preparation commands to run before they are unpacked (``stage_preparation``)."""

    def __init__(self) -> None:
        self._members: list[Member] = []
        self.targets: list[str] = []
        self.preparations: list[str] = []
        self._packer = tarfile.open(fileobj=io.BytesIO(), mode="w")  # only for gettarinfo

    def _member(self, path: str, name: str) -> Member:
        info = _root_owned(self._packer.gettarinfo(path, arcname=name))
        if not info.isfile():
            return info, None
        with open(path, "rb") as file:
            return info, file.read()

    def _stage(self, members: list[Member], target: str) -> list[Member]:
        self._members += members
        self.targets.append(target)
        return members

    def add_dir(self, source: Path, target: str) -> list[Member]:
        """Stage the tree under ``source`` at ``target``; returns the members staged."""
        name = target.lstrip("/")
        top = os.fspath(source)
        members = []
        if name and not os.listdir(top):  # an empty tree still makes its target, like ``mkdir -p``
            members.append(self._member(top, name))
        # Names are joined as strings: pathlib's relative_to costs more than the tar header.
        for root, dirs, files in os.walk(top):
            dirs.sort()
            below = posixpath.relpath(root, top) if root != top else ""
            for entry in sorted(dirs + files):
                relative = posixpath.join(below, entry) if below else entry
                members.append(self._member(os.path.join(root, entry), posixpath.join(name, relative)))
        return self._stage(members, target)

    def add_file(self, source: Path, target: str) -> list[Member]:
        return self._stage([self._member(os.fspath(source), target.lstrip("/"))], target)

    def make_executable(self, path: str) -> bool:
        """``chmod +x`` on a staged regular file, applied to what will be sent; False when
        ``path`` is not staged (the command must then run)."""
        name = path.lstrip("/")
        hits = [info for info, _ in self._members if info.name == name and info.isfile()]
        for info in hits:
            info.mode |= (info.mode & 0o444) >> 2  # +x where readable, as chmod +x does under umask 022
        return bool(hits)

    def overlaps(self, path: str) -> bool:
        return any(overlaps(path, target) for target in self.targets)

    def take_preparations(self) -> str:
        """The staged preparation commands as one shell prefix (and forget them)."""
        prefix = "".join(f"{{ {command}; }} && " for command in self.preparations)
        self.preparations = []
        return prefix

    def take(self) -> bytes | None:
        """The archive of everything staged (and forget it), or None when nothing is."""
        if not self._members:
            return None
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in self._members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        self.clear()
        return buffer.getvalue()

    def clear(self) -> int:
        """Forget everything staged; returns how many uploads that was."""
        dropped = len(self.targets)  # a staged preparation counts by its paths too
        self._members, self.targets, self.preparations = [], [], []
        return dropped


class ArchiveTransfers:
    """The transfers of one sandbox over its archive calls (see the module docstring)."""

    def __init__(
        self,
        put: Put,
        get: Get,
        limits: TransferLimits,
        logger: Logger | None = None,
        *,
        get_together: GetTogether | None = None,
        companions: tuple[str, ...] = (),
        put_after: PutAfter | None = None,
    ) -> None:
        self._put = put
        self._put_after = put_after
        self._get = get
        self._get_together = get_together
        self._limits = limits
        self._companions = tuple(_norm(c) for c in companions if not overlaps(_norm(c), LOG_ROOT))
        self._logger = logger or log
        self._staged = _Staged()
        self._snapshots: list[Snapshot] = []

    # ── uploads ──────────────────────────────────────────────────────────────
    def stage_dir(self, source: Path, target: str) -> None:
        if not source.is_dir():
            raise FileNotFoundError(f"Source directory {source} does not exist")
        self._lay_over(self._staged.add_dir(source, _norm(target)))

    def stage_file(self, source: Path, target: str) -> None:
        if not source.is_file():
            raise FileNotFoundError(f"Source file {source} does not exist")
        self._lay_over(self._staged.add_file(source, _norm(target)))

    def _lay_over(self, members: list[Member]) -> None:
        for snapshot in self._snapshots:
            snapshot.lay_over(members)

    @property
    def stages_preparations(self) -> bool:
        """Whether a preparation command can ride the next put (`stage_preparation`)."""
        return self._put_after is not None

    def stage_preparation(self, command: str, paths: list[str]) -> None:
        """Run the root shell ``command`` (Harbor's emptying of ``paths``, whose answer Harbor
        does not read) before the next put unpacks, in the same command: it runs before
        anything can observe ``paths``, as every command and every read there flushes first."""
        assert self._put_after is not None, "this route cannot run a command with its put"
        norm = [_norm(p) for p in paths]
        self._forget(lambda s: any(s.overlaps(p) for p in norm))
        self._staged.preparations.append(command)
        self._staged.targets.extend(norm)

    async def flush(self) -> None:
        """Send everything staged, in one call (a staged preparation rides it)."""
        prefix = self._staged.take_preparations()
        data = self._staged.take()
        self._staged.clear()  # a preparation's paths, staged without members
        if prefix:
            assert self._put_after is not None
            await self._put_after(data, "/", prefix)
        elif data is not None:
            await self._put(data, "/")

    def make_executable(self, path: str) -> bool:
        """Apply ``chmod +x path`` to a staged file instead of running it (see `_Staged`)."""
        return self._staged.make_executable(_norm(path))

    async def flush_overlapping(self, paths: list[str]) -> None:
        """Before a command that touches only ``paths``: when anything staged lies there, send
        what is staged (all of it, in one call); else leave it staged."""
        if any(self._staged.overlaps(_norm(p)) for p in paths):
            await self.flush()

    def command_ran(self, paths: list[str] | None = None) -> None:
        """A command may have changed anything (or, given ``paths``, what lies there): the
        snapshots it may have changed answer no more."""
        norm = None if paths is None else [_norm(p) for p in paths]
        self._forget(lambda s: norm is None or any(s.overlaps(p) for p in norm))

    def _forget(self, which: Callable[[Snapshot], bool]) -> None:
        for snapshot in [s for s in self._snapshots if which(s)]:
            self._snapshots.remove(snapshot)
            snapshot.close()

    def discard(self) -> int:
        """The sandbox is going away: drop what is staged (nothing could observe it)."""
        self._forget(lambda s: True)
        return self._staged.clear()

    # ── folds into a command's own exec (``exec_folds.py``) ─────────────────────
    def take_staged(self) -> tuple[bytes | None, str] | None:
        """What the next command must see unpacked first (the staged tar and the preparation
        shell), taken to ride that command; None when nothing is staged."""
        prefix = self._staged.take_preparations()
        data = self._staged.take()
        self._staged.clear()
        if data is None and not prefix:
            return None
        return data, prefix.removesuffix(" && ")

    def fold_roots(self) -> tuple[str, ...]:
        """The trees a fetch of ``/logs`` packs: ``/logs`` and the companions read after it."""
        return (LOG_ROOT, *self._companions) if self._get_together is not None else (LOG_ROOT,)

    async def adopt(self, present: tuple[str, ...], fill: Callable[[BinaryIO], Awaitable[None]]) -> None:
        """A fetch of ``fold_roots()`` made by the pack after a command (``fill`` writes its tar),
        answering the reads that follow as `_fetch` would have."""
        archive = tempfile.TemporaryFile()
        try:
            await fill(archive)
            roots = self.fold_roots()
            also = tuple(r for r in roots[1:] if r in present) + tuple(r for r in roots[1:] if r not in present)
            snapshot = await asyncio.to_thread(Snapshot, LOG_ROOT, archive, self._limits, also=also)
        except BaseException:
            archive.close()
            raise
        self._forget(lambda s: any(s.overlaps(r) for r in snapshot.roots))
        self._snapshots.append(snapshot)

    # ── reads ────────────────────────────────────────────────────────────────
    async def _fetch(self, root: str) -> Snapshot:
        archive = tempfile.TemporaryFile()
        try:
            if root == LOG_ROOT and self._companions and self._get_together is not None:
                if any(self._staged.overlaps(c) for c in self._companions):
                    await self.flush()
                present = await self._get_together([root, *self._companions], archive)
                also = tuple(c for c in self._companions if c in present)
                missing = tuple(c for c in self._companions if c not in present)
                snapshot = await asyncio.to_thread(Snapshot, root, archive, self._limits, also=also + missing)
                return snapshot  # a companion that was not there is absent from it, as in the sandbox
            await self._get(root, archive)
            return await asyncio.to_thread(Snapshot, root, archive, self._limits)
        except BaseException:
            archive.close()
            raise

    async def _snapshot_for(self, path: str) -> Snapshot:
        path = _norm(path)
        for snapshot in self._snapshots:
            if snapshot.answers(path):
                return snapshot
        root = LOG_ROOT if path.startswith(LOG_ROOT + "/") else path
        if self._staged.overlaps(root):  # what is fetched must include what was uploaded there
            await self.flush()
        try:
            snapshot = await self._fetch(root)
        except FileNotFoundError:
            if root == path:
                raise
            snapshot = await self._fetch(path)  # no /logs at all: ask for the path itself
        self._forget(lambda s: any(s.overlaps(r) for r in snapshot.roots))
        self._snapshots.append(snapshot)
        return snapshot

    async def kind(self, path: str) -> str | None:
        try:
            snapshot = await self._snapshot_for(path)
            return await asyncio.to_thread(snapshot.kind, _norm(path))
        except FileNotFoundError:
            return None

    async def download_dir(self, source: str, target: Path) -> None:
        snapshot = await self._snapshot_for(source)
        await asyncio.to_thread(snapshot.extract_dir, _norm(source), target, self._logger)

    async def download_file(self, source: str, target: Path) -> None:
        snapshot = await self._snapshot_for(source)
        await asyncio.to_thread(snapshot.copy_file, _norm(source), target)
