"""Writing beneath one host directory through directory file descriptors, never following a link.

Every path is a tuple of components below the root. Each directory on the way is opened with
``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's fd (the ``openat`` walk of runc and
``filepath-securejoin``), and every entry is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``
relative to its directory's fd: a link planted anywhere in the tree, by this archive or an
earlier one, is replaced or refused, never followed. Modes and mtimes are set through the
file's own fd. Later entries win, as they do in ``tar``: a file or link in the way of a
directory or a file is removed (``unlink`` removes the link, not its target); a directory in
the way of anything else makes that entry a `Conflict`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["Beneath", "Conflict", "Parts"]

Parts = tuple[str, ...]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
_OPEN_DIRS = 128  # directory fds kept open (least recently used are closed)


class Conflict(Exception):
    """This entry cannot be written where it is named (the member is dropped, with the reason)."""


class Beneath:
    """A directory tree under ``root`` that is written only through dir fds (see the module)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._dirs: OrderedDict[Parts, int] = OrderedDict()

    def __enter__(self) -> Beneath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        os.close(self._root_fd)

    # ── directories ──────────────────────────────────────────────────────────
    def directory(self, parts: Parts) -> int:
        """The fd of the directory at ``parts``, made (0755) with its parents where missing."""
        if not parts:
            return self._root_fd
        fd = self._dirs.get(parts)
        if fd is not None:
            self._dirs.move_to_end(parts)
            return fd
        fd = self._open_or_make(self.directory(parts[:-1]), parts[-1])
        self._dirs[parts] = fd
        if len(self._dirs) > _OPEN_DIRS:
            os.close(self._dirs.popitem(last=False)[1])
        return fd

    def _open_or_make(self, parent: int, name: str) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            os.unlink(name, dir_fd=parent)  # a file or a link where a directory goes
        os.mkdir(name, 0o755, dir_fd=parent)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        os.fchmod(fd, 0o755)
        return fd

    # ── entries ──────────────────────────────────────────────────────────────
    def _clear(self, parent: int, name: str) -> None:
        """Make room for a new entry: remove a file or link there; a directory is a conflict."""
        try:
            st = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise Conflict("a directory is in the way")
        os.unlink(name, dir_fd=parent)

    def _create(self, parts: Parts) -> int:
        parent = self.directory(parts[:-1])
        try:
            return os.open(parts[-1], _NEW_FILE, 0o600, dir_fd=parent)
        except FileExistsError:
            self._clear(parent, parts[-1])
            return os.open(parts[-1], _NEW_FILE, 0o600, dir_fd=parent)

    def write_file(self, parts: Parts, source: IO[bytes], size: int, mode: int, mtime: float | None) -> None:
        """A new regular file at ``parts`` with ``size`` bytes read from ``source``."""
        fd = self._create(parts)
        try:
            remaining = size
            while remaining > 0:
                chunk = source.read(min(_CHUNK, remaining))
                if not chunk:
                    raise EOFError(f"archive ended inside {'/'.join(parts)!r}")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                remaining -= len(chunk)
            _finish(fd, mode, mtime)
        finally:
            os.close(fd)

    def copy_file(self, source: Parts, target: Parts, check: Callable[[int], None], mtime: float | None) -> int:
        """Copy the regular file at ``source`` (in this tree) to ``target``; ``check`` sees the
        size first and may refuse it. Returns the bytes copied."""
        src = os.open(source[-1], _READ_FILE, dir_fd=self.directory(source[:-1]))
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                raise Conflict("its target is no longer a regular file")
            check(st.st_size)
            dst = self._create(target)
            try:
                copied = _copy(src, dst, st.st_size)
                _finish(dst, st.st_mode & 0o777, mtime)
            finally:
                os.close(dst)
            return copied
        finally:
            os.close(src)

    def symlink(self, parts: Parts, target: str) -> None:
        parent = self.directory(parts[:-1])
        try:
            os.symlink(target, parts[-1], dir_fd=parent)
        except FileExistsError:
            self._clear(parent, parts[-1])
            os.symlink(target, parts[-1], dir_fd=parent)

    def unlink(self, parts: Parts) -> None:
        os.unlink(parts[-1], dir_fd=self.directory(parts[:-1]))

    def escapes(self, parts: Parts) -> bool:
        """Whether following the link at ``parts`` now (through every link it meets) leads out
        of the tree. Reads only (``readlink`` / ``lstat``)."""
        root = os.path.realpath(self.root)
        resolved = os.path.realpath(os.path.join(self.root, *parts))
        return os.path.commonpath([root, resolved]) != root


def _copy(src: int, dst: int, size: int) -> int:
    """``size`` bytes from fd ``src`` to fd ``dst`` (in the kernel where it can)."""
    copied = 0
    try:
        while copied < size and (sent := os.copy_file_range(src, dst, size - copied)):
            copied += sent
        return copied
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    while copied < size and (chunk := os.pread(src, min(_CHUNK, size - copied), copied)):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]
        copied += len(chunk)
    return copied


def safe_mode(mode: int) -> int:
    """0755 when any execute bit is set, else 0644: never setuid, setgid, sticky or writable by others."""
    return 0o755 if mode & 0o111 else 0o644


def _finish(fd: int, mode: int, mtime: float | None) -> None:
    os.fchmod(fd, safe_mode(mode))
    if mtime is not None:
        try:
            os.utime(fd, (mtime, mtime))
        except (OverflowError, ValueError, OSError):
            pass  # an absurd mtime from the archive: keep the time of writing
