"""One tree fetched from a sandbox as a tar in a host temp file, answering reads of it.

The archive is never held in memory: it is streamed to an anonymous temp file (bounded by
the fetch), indexed by header (kind, data offset and size per path; the content stays in
the file), and every answer is read from the file at an offset (``os.pread``, so answers
share no file position). A directory is handed out by extracting that subtree of the
archive with our own extractor (``sandbox/extract``); a file by copying its bytes.

Uploads made since the fetch are laid over it (their content is known): later entries win,
as they do when the sandbox extracts them.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import tarfile
from pathlib import Path
from typing import IO

from osmosis_harbor.errors import UnreadableArchiveError
from osmosis_harbor.sandbox.transfer.extract import ExtractResult, TransferLimits, extract_archive, write_file
from osmosis_harbor.sandbox.transfer.extract.archive import member_parts

__all__ = ["Member", "Snapshot"]

Member = tuple[tarfile.TarInfo, bytes | None]  # a host-made tar entry and its content (files only)
_Entry = tuple[str, int, int]  # kind ("dir", "file", "other"), data offset, size
Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


class _Slice(io.RawIOBase):
    """``size`` bytes of a file descriptor from ``offset``, read with ``pread``."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self._fd, self._start, self._pos, self._end = fd, offset, offset, offset + size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos - self._start

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: self._start, os.SEEK_CUR: self._pos, os.SEEK_END: self._end}[whence]
        self._pos = max(self._start, base + offset)
        return self.tell()

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._end - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


class _Index:
    """Each member's absolute sandbox path (the archive is named from ``parent``'s child)."""

    def __init__(self, parent: str) -> None:
        self.parent = parent
        self.entries: dict[str, _Entry] = {}

    def _path(self, name: str) -> str | None:
        try:
            return posixpath.join(self.parent, *member_parts(name))
        except Exception:
            return None  # a name the extractor drops: nothing to answer

    def add(self, member: tarfile.TarInfo) -> None:
        path = self._path(member.name)
        if path is None:
            return
        if member.isdir():
            self.entries[path] = ("dir", 0, 0)
        elif member.isfile() and not member.sparse:
            self.entries[path] = ("file", member.offset_data, member.size)
        elif member.islnk():
            link = self._path(member.linkname)
            source = self.entries.get(link) if link is not None else None
            self.entries[path] = source if source is not None and source[0] == "file" else ("other", 0, 0)
        else:
            self.entries[path] = ("other", 0, 0)

    def scan(self, archive: IO[bytes], transfer: str) -> None:
        """Headers only (the content is skipped over)."""
        try:
            with tarfile.open(fileobj=archive, mode="r:") as tar:
                while (member := tar.next()) is not None:
                    tar.members.clear()  # type: ignore[attr-defined]  # keep no headers
                    self.add(member)
        except (tarfile.TarError, EOFError) as exc:
            raise UnreadableArchiveError(transfer, exc) from None


class Snapshot:
    """One fetched tree (``root``), by absolute path, with the uploads made since laid over it;
    or several trees fetched together in one archive (``also``: members named from ``/``)."""

    def __init__(self, root: str, archive: IO[bytes], limits: TransferLimits, *, also: tuple[str, ...] = ()) -> None:
        self.root = root
        self._limits = limits
        self.roots = (root, *also)
        self._archive = archive
        self._size = archive.seek(0, os.SEEK_END)
        archive.seek(0)
        self._parent = "/" if also else posixpath.dirname(root)
        self._index: _Index | None = None  # built by the first extraction, or on demand
        self._overlay: dict[str, Member] = {}

    @property
    def _entries(self) -> dict[str, _Entry]:
        if self._index is None:
            index = _Index(self._parent)
            index.scan(self._whole(), self.root)
            self._index = index
        return self._index.entries

    def _whole(self) -> io.BufferedReader:
        return io.BufferedReader(_Slice(self._archive.fileno(), 0, self._size), buffer_size=1 << 20)

    def close(self) -> None:
        self._archive.close()

    def answers(self, path: str) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in self.roots)

    def overlaps(self, path: str) -> bool:
        """One of its trees is ``path`` or lies under it, or ``path`` lies under one."""
        return self.answers(path) or any(root.startswith(path.rstrip("/") + "/") for root in self.roots)

    def lay_over(self, members: list[Member]) -> None:
        """Apply staged members (named relative to ``/``) as the sandbox will."""
        for info, data in members:
            path = "/" + info.name.strip("/")
            if not self.answers(path):
                continue
            parent = posixpath.dirname(path)
            while self.answers(parent) and self._absent(parent):  # made by the extraction
                made = tarfile.TarInfo(parent.lstrip("/"))
                made.type, made.mode = tarfile.DIRTYPE, 0o755
                self._overlay[parent] = (made, None)
                parent = posixpath.dirname(parent)
            self._overlay[path] = (info, data)

    def _absent(self, path: str) -> bool:
        """Not in the snapshot, as far as known without scanning (staging runs on the event
        loop): before the archive is indexed, an implicit directory is laid over anyway."""
        if path in self._overlay:
            return False
        return self._index is None or path not in self._index.entries

    def _check_dir(self, path: str) -> None:
        kind = self.kind(path)
        if kind is None:
            raise FileNotFoundError(f"no such directory in the sandbox: {path}")
        if kind != "dir":
            raise NotADirectoryError(f"{path} is not a directory in the sandbox")

    def kind(self, path: str) -> str | None:
        """ "dir", "file", "other" (links, devices) or None when absent. May scan the
        archive's headers (the first question before any extraction): call it off the loop."""
        if (laid := self._overlay.get(path)) is not None:
            return "dir" if laid[0].isdir() else "file" if laid[0].isfile() else "other"
        entry = self._entries.get(path)
        return entry[0] if entry is not None else None

    def copy_file(self, path: str, target: Path) -> None:
        """Write the regular file at ``path`` to host path ``target``."""
        kind = self.kind(path)
        if kind is None:
            raise FileNotFoundError(f"no such file in the sandbox: {path}")
        if kind != "file":
            raise IsADirectoryError(f"{path} is not a regular file in the sandbox")
        target.parent.mkdir(parents=True, exist_ok=True)
        if (laid := self._overlay.get(path)) is not None:
            write_file(target, laid[1] or b"")
            return
        _, offset, size = self._entries[path]
        write_file(target, io.BufferedReader(_Slice(self._archive.fileno(), offset, size)), size)

    def extract_dir(self, path: str, target: Path, logger: Logger) -> ExtractResult:
        """Extract the contents of directory ``path`` into host directory ``target``.

        The first extraction indexes the archive in the same pass (a tree of many small
        files costs its header parsing once), and so learns only afterwards whether
        ``path`` was a directory: what it wrote then is nothing (no member lies under a
        missing path or a file)."""
        index = None
        if self._index is None:
            index = _Index(self._parent)
        else:
            self._check_dir(path)
        subtree = posixpath.relpath(path, self._parent)
        visit = index.add if index is not None else None
        result = extract_archive(
            self._whole(), target, transfer=path, limits=self._limits, subtree=subtree, logger=logger, visit=visit
        )
        if index is not None:
            self._index = index
            self._check_dir(path)
        laid = [m for p, m in sorted(self._overlay.items()) if p.startswith(path.rstrip("/") + "/")]
        if laid:  # host-made content: packed and extracted the same way, on top
            extract_archive(
                io.BytesIO(_pack(laid)),
                target,
                transfer=path,
                limits=self._limits,
                subtree=path.strip("/"),
                logger=logger,
            )
        return result


def _pack(members: list[Member]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()
