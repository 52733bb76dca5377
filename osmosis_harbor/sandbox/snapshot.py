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
from osmosis_harbor.sandbox.extract import ExtractResult, extract_archive, write_file
from osmosis_harbor.sandbox.extract.archive import member_parts

__all__ = ["Member", "Snapshot"]

Member = tuple[tarfile.TarInfo, bytes | None]  # a host-made tar entry and its content (files only)
_Entry = tuple[str, int, int]  # kind ("dir", "file", "other"), data offset, size
Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


class _Slice(io.RawIOBase):
    """``size`` bytes of a file descriptor from ``offset``, read with ``pread``."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self._fd, self._pos, self._end = fd, offset, offset + size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._end - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _index(archive: IO[bytes], parent: str, transfer: str) -> dict[str, _Entry]:
    """Each member's absolute sandbox path (the archive is named from ``parent``'s child)."""
    entries: dict[str, _Entry] = {}
    try:
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()  # type: ignore[attr-defined]  # keep no headers
                try:
                    path = posixpath.join(parent, *member_parts(member.name))
                except Exception:
                    continue  # a name the extractor drops: nothing to answer
                if member.isdir():
                    entries[path] = ("dir", 0, 0)
                elif member.isfile() and not member.sparse:
                    entries[path] = ("file", member.offset_data, member.size)
                elif member.islnk():
                    try:
                        source = entries.get(posixpath.join(parent, *member_parts(member.linkname)))
                    except Exception:
                        source = None
                    entries[path] = source if source is not None and source[0] == "file" else ("other", 0, 0)
                else:
                    entries[path] = ("other", 0, 0)
    except (tarfile.TarError, EOFError) as exc:
        raise UnreadableArchiveError(transfer, exc) from None
    return entries


class Snapshot:
    """One fetched tree (``root``), by absolute path, with the uploads made since laid over it."""

    def __init__(self, root: str, archive: IO[bytes]) -> None:
        self.root = root
        self._archive = archive
        self._size = archive.seek(0, os.SEEK_END)
        archive.seek(0)
        self._parent = posixpath.dirname(root)
        self._entries = _index(archive, self._parent, root)
        self._overlay: dict[str, Member] = {}

    def close(self) -> None:
        self._archive.close()

    def answers(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root.rstrip("/") + "/")

    def lay_over(self, members: list[Member]) -> None:
        """Apply staged members (named relative to ``/``) as the sandbox will."""
        for info, data in members:
            path = "/" + info.name.strip("/")
            if not self.answers(path):
                continue
            parent = posixpath.dirname(path)
            while self.answers(parent) and self.kind(parent) is None:  # made by the extraction
                made = tarfile.TarInfo(parent.lstrip("/"))
                made.type, made.mode = tarfile.DIRTYPE, 0o755
                self._overlay[parent] = (made, None)
                parent = posixpath.dirname(parent)
            self._overlay[path] = (info, data)

    def kind(self, path: str) -> str | None:
        """ "dir", "file", "other" (links, devices) or None when absent."""
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
        """Extract the contents of directory ``path`` into host directory ``target``."""
        kind = self.kind(path)
        if kind is None:
            raise FileNotFoundError(f"no such directory in the sandbox: {path}")
        if kind != "dir":
            raise NotADirectoryError(f"{path} is not a directory in the sandbox")
        archive = io.BufferedReader(_Slice(self._archive.fileno(), 0, self._size), buffer_size=1 << 20)
        subtree = posixpath.relpath(path, self._parent)
        result = extract_archive(archive, target, transfer=path, subtree=subtree, logger=logger)
        laid = [m for p, m in sorted(self._overlay.items()) if p.startswith(path.rstrip("/") + "/")]
        if laid:  # host-made content: packed and extracted the same way, on top
            extract_archive(io.BytesIO(_pack(laid)), target, transfer=path, subtree=path.strip("/"), logger=logger)
        return result


def _pack(members: list[Member]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()
