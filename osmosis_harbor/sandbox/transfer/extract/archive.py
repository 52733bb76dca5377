"""Extracting a tar made in a sandbox onto the host: our own code, never ``tarfile.extract*``.

``tarfile`` only reads headers here (stream mode, member by member); `Beneath` writes. What
arrives (see docs/threat-model.md):

* regular files (mode 0644, or 0755 when any execute bit was set) and directories (0755);
* hardlinks as copies of a regular file this same extraction already wrote;
* symlinks that are relative and stay inside the tree, followed through every other link
  of the tree; they are made last, so no entry is ever written through one;
* nothing else: devices, FIFOs, absolute or ``..`` names, escaping links are dropped, each
  named in the trial's log and in the `ExtractResult`.

``subtree`` extracts one directory of the archive: member names *and hardlink targets* are
rebased onto it, so a hardlink to ``logs/agent/x`` means the archive's ``logs/agent/x``
wherever it is extracted, never a nested member that happens to carry that name.

Bounds (`TransferLimits`) raise `TransferLimitError`: entries, file bytes (hardlink copies
count), bytes per file, path depth and length. Extraction is blocking: call it off the event
loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import errno
import logging
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict

from osmosis_harbor.errors import TransferLimitError, UnreadableArchiveError
from osmosis_harbor.sandbox.transfer.extract.beneath import Beneath, Conflict, Parts
from osmosis_harbor.sandbox.transfer.extract.limits import TransferLimits, masked

__all__ = ["DroppedMember", "ExtractResult", "extract_archive", "member_parts"]

log = logging.getLogger(__name__)

NAMED_DROPS = 20
_NAME_ERRORS = (
    errno.ENAMETOOLONG,
    errno.EILSEQ,
    errno.EINVAL,
)  # dropped members named one by one in the result and the log line


class DroppedMember(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    reason: str


class ExtractResult(BaseModel):
    """What one extraction wrote, and what it refused (the first `NAMED_DROPS` by name)."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    dropped_count: int = 0
    dropped: list[DroppedMember] = []

    def drop(self, name: str, reason: str) -> None:
        self.dropped_count += 1
        if len(self.dropped) < NAMED_DROPS:
            self.dropped.append(DroppedMember(name=name, reason=reason))

    def log_dropped(self, logger: logging.Logger | logging.LoggerAdapter[logging.Logger], transfer: str) -> None:
        if not self.dropped_count:
            return
        named = masked("; ".join(f"{d.name!r} ({d.reason})" for d in self.dropped), limit=4000)
        more = self.dropped_count - len(self.dropped)
        logger.warning(
            f"sandbox output {transfer}: {self.dropped_count} entr{'y' if self.dropped_count == 1 else 'ies'} "
            f"dropped on the host: {named}{f' and {more} more' if more else ''}"
        )


class _Drop(Exception):
    """This member is refused (the reason is the message)."""


def member_parts(name: str) -> Parts:
    """A member's name as components below the extraction root; `_Drop` when it names
    anything outside (absolute, ``..``) or holds a NUL."""
    if "\x00" in name:
        raise _Drop("NUL in the name")
    if name.startswith("/"):
        raise _Drop("absolute name")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _Drop("'..' in the name")
    return parts


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr() or member.isblk():
        return "device node"
    if member.isfifo():
        return "FIFO"
    return f"unsupported member type {member.type!r}"


class _Extraction:
    """One pass over one archive (the state the member handlers share)."""

    def __init__(self, tree: Beneath, limits: TransferLimits, prefix: Parts, transfer: str) -> None:
        self.tree = tree
        self.limits = limits
        self.prefix = prefix
        self.transfer = transfer
        self.result = ExtractResult()
        self.entries = 0
        self.written: set[Parts] = set()  # regular files this pass wrote (hardlink sources)
        self.links: dict[Parts, tuple[str, int]] = {}  # symlinks to make at the end: target, member index
        self.last: dict[Parts, int] = {}  # which member last named each path (later wins)

    def rebase(self, name: str) -> Parts | None:
        """Parts below the subtree, or None when the member lies outside it (not requested)."""
        parts = member_parts(name)
        if parts[: len(self.prefix)] != self.prefix:
            return None
        return parts[len(self.prefix) :]

    def count(self, parts: Parts) -> None:
        self.entries += 1
        limits, transfer = self.limits, self.transfer
        if self.entries > limits.max_files:
            raise TransferLimitError(
                transfer, "the number of entries", self.entries, limits.max_files, "transfer_max_files"
            )
        shown = "/".join(parts)
        if len(parts) > limits.max_depth:
            raise TransferLimitError(
                transfer, f"the depth of {masked(shown)!r}", len(parts), limits.max_depth, "transfer_max_depth"
            )
        if (length := len(shown.encode("utf-8", "surrogateescape"))) > limits.max_path_bytes:
            raise TransferLimitError(
                transfer,
                f"the path length of {masked(shown)!r}",
                length,
                limits.max_path_bytes,
                "transfer_max_path_bytes",
            )

    def add_bytes(self, name: str, size: int) -> None:
        self.limits.check_file(self.transfer, name, size)
        total = self.result.bytes + size
        if total > self.limits.max_bytes:
            raise TransferLimitError(
                self.transfer, "the total of file bytes", total, self.limits.max_bytes, "transfer_max_bytes"
            )
        self.result.bytes = total

    def member(self, index: int, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        parts = self.rebase(member.name)
        if parts is None:
            return
        if not parts:
            if not member.isdir():
                raise _Drop("names the root of the transfer")
            return
        self.count(parts)
        self.last[parts] = index
        shown = "/".join(parts)
        if member.isdir():
            self.tree.directory(parts)
            self.written.discard(parts)
            self.result.dirs += 1
        elif member.isfile():
            self.add_bytes(shown, member.size)
            source = tar.extractfile(member)
            assert source is not None
            self.tree.write_file(parts, source, member.size, member.mode, member.mtime)
            self.written.add(parts)
            self.result.files += 1
        elif member.islnk():
            self.hardlink(parts, member)
        elif member.issym():
            self.symlink(parts, member.linkname, index)
        else:
            raise _Drop(_kind(member))

    def hardlink(self, parts: Parts, member: tarfile.TarInfo) -> None:
        try:
            target = self.rebase(member.linkname)
        except _Drop as exc:
            raise _Drop(f"hardlink target: {exc}") from None
        if target is None or target not in self.written:
            raise _Drop(f"hardlink to {member.linkname!r}, not a regular file of this transfer")
        self.tree.copy_file(target, parts, lambda size: self.add_bytes("/".join(parts), size), member.mtime)
        self.written.add(parts)
        self.result.files += 1

    def symlink(self, parts: Parts, target: str, index: int) -> None:
        if not target or "\x00" in target:
            raise _Drop("empty symlink target")
        if target.startswith("/"):
            raise _Drop(f"absolute symlink to {target!r}")
        lexical = posixpath.normpath(posixpath.join(*parts[:-1], target) if parts[:-1] else target)
        if lexical == ".." or lexical.startswith("../"):
            raise _Drop(f"symlink to {target!r} leaves the tree")
        self.links[parts] = (target, index)

    def make_links(self) -> None:
        """Make the symlinks no later member replaced, then drop every one that, followed
        through the tree's links as they now are, leads outside (until none does)."""
        made: list[Parts] = []
        for parts, (target, index) in self.links.items():
            if self.last.get(parts) != index:
                continue  # a later member of the same name won
            try:
                self.tree.symlink(parts, target)
            except (Conflict, OSError) as exc:
                self.result.drop("/".join(parts), f"symlink not made: {exc}")
                continue
            self.written.discard(parts)
            made.append(parts)
        while escaping := [p for p in made if self.tree.escapes(p)]:
            for parts in escaping:
                self.tree.unlink(parts)
                made.remove(parts)
                self.result.drop("/".join(parts), f"symlink to {self.links[parts][0]!r} leads out of the tree")
        self.result.symlinks = len(made)


def _members(tar: tarfile.TarFile) -> Iterator[tuple[int, tarfile.TarInfo]]:
    """Members one at a time, forgetting each (stream mode keeps none of them for us)."""
    index = 0
    while (member := tar.next()) is not None:
        yield index, member
        index += 1
        tar.members.clear()  # type: ignore[attr-defined]  # stream mode would keep every header


def extract_archive(
    source: BinaryIO,
    target: Path,
    *,
    transfer: str,
    limits: TransferLimits,
    subtree: str | None = None,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    visit: Callable[[tarfile.TarInfo], None] | None = None,
) -> ExtractResult:
    """Extract the tar stream ``source`` (plain or compressed) into ``target``, made if missing.

    ``transfer`` names it in errors and logs (the sandbox path); ``subtree`` (an archive
    path) extracts only that directory's contents. Dropped members are logged as one warning
    on ``logger``. ``visit`` sees every member's header first (an index built in the same pass)."""
    with Beneath(target) as tree:
        run = _Extraction(tree, limits, member_parts(subtree) if subtree else (), transfer)
        try:
            with tarfile.open(fileobj=source, mode="r|*") as tar:
                for index, member in _members(tar):
                    if visit is not None:
                        visit(member)
                    try:
                        run.member(index, member, tar)
                    except (_Drop, Conflict) as exc:
                        run.result.drop(member.name, str(exc))
                    except OSError as exc:
                        if exc.errno not in _NAME_ERRORS:
                            raise
                        run.result.drop(member.name, exc.strerror or str(exc))
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise UnreadableArchiveError(transfer, exc) from None
        run.make_links()
    run.result.log_dropped(logger or log, transfer)
    return run.result
