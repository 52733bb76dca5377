"""Reading and writing sandbox files through the engine's archive API.

``write_bytes`` / ``read_bytes`` go through ``put_archive`` / ``get_archive`` (and a HEAD on
the same endpoint to stat a path) rather than an exec: binary-safe, no shell quoting, any
size, and no dependency on what the image has installed. The same two endpoints are also
offered raw (``put_archive`` / ``get_archive``): a whole directory tree in one call each way,
which is the optional archive capability ``SandboxEnvironment`` uses when an SDK has it. The work is in the details the
archive API leaves to the caller (creating missing parents, following symlinks, telling "no
such file" from "the sandbox is gone"), which is why it lives apart from the facade.
"""

from __future__ import annotations

import base64
import errno
import io
import json
import posixpath
import tarfile
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import docker.errors

from osmosis_harbor.errors import SandboxNotFoundError
from osmosis_harbor.sandbox.transfer.extract import TransferLimits, copy_into

_MODE_DIR = 1 << 31
_MODE_SYMLINK = 1 << 27
_MAX_SYMLINK_HOPS = 8
_CHUNK = 1 << 20
_TAR_OVERHEAD = 64 * 1024  # a single file's tar: headers, long names, padding


def _abs_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"sandbox paths must be absolute, got {path!r}")
    return posixpath.normpath(path)


def _file_tar(base: str, new_dirs: list[str], path: str, data: bytes) -> bytes:
    """A tar of the missing parent directories (0755) and the file (0644), relative to *base*."""
    buf = io.BytesIO()
    mtime = time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in new_dirs:
            info = tarfile.TarInfo(posixpath.relpath(directory, base))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        info = tarfile.TarInfo(posixpath.relpath(path, base))
        info.size, info.mode, info.mtime = len(data), 0o644, mtime
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _single_file(archive: io.BytesIO, path: str) -> bytes:
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        member = tar.next()
        if member is None or not member.isfile():
            raise IsADirectoryError(errno.EISDIR, "not a regular file in the sandbox", path)
        extracted = tar.extractfile(member)
        assert extracted is not None
        return extracted.read()


class SandboxFiles:
    """The files of one container. *gone* builds the error for "the container no longer exists"."""

    def __init__(
        self,
        api: Any,
        container_id: str,
        gone: Callable[[Exception], SandboxNotFoundError],
        limits: TransferLimits,
    ) -> None:
        self._api = api
        self._limits = limits
        self._id = container_id
        self._gone = gone

    def _stat(self, path: str) -> dict[str, Any] | None:
        """The engine's stat of *path* (HEAD on the archive endpoint), None if missing."""
        api = self._api
        resp = api.head(api._url("/containers/{0}/archive", self._id), params={"path": path})
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            self._raise_stat_error(path)
        stat: dict[str, Any] = json.loads(base64.b64decode(resp.headers["X-Docker-Container-Path-Stat"]))
        return stat

    def _raise_stat_error(self, path: str) -> None:
        """HEAD carries no error text: repeat as GET to learn why (e.g. a file used as a dir)."""
        api = self._api
        resp = api.get(api._url("/containers/{0}/archive", self._id), params={"path": path}, stream=True)
        try:
            message = resp.json().get("message", "") if resp.status_code != 200 else ""
        except ValueError:
            message = resp.text
        finally:
            resp.close()
        if "not a directory" in message:
            raise NotADirectoryError(errno.ENOTDIR, "a parent is not a directory in the sandbox", path)
        api._raise_for_status(resp)
        raise OSError(errno.EIO, f"cannot stat in the sandbox: {message}", path)

    def _require_alive(self) -> None:
        if self._stat("/") is None:
            raise self._gone(FileNotFoundError("/"))

    def _existing_ancestor(self, directory: str) -> tuple[str, list[str]]:
        """Deepest existing ancestor of *directory* and the directories to create below it."""
        missing: list[str] = []
        while True:
            st = self._stat(directory)
            if st is None:
                if directory == "/":
                    raise self._gone(FileNotFoundError("/"))
                missing.append(directory)
                directory = posixpath.dirname(directory)
                continue
            if not st["mode"] & (_MODE_DIR | _MODE_SYMLINK):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory in the sandbox", directory)
            return directory, list(reversed(missing))

    def write_bytes(self, data: bytes | bytearray | memoryview, path: str, *, parents: bool = True) -> None:
        """Write *data* to *path*, creating parent directories (mode 0755; file 0644) unless
        ``parents`` is off (then a missing parent is ``FileNotFoundError``)."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        path = _abs_path(path)
        st = self._stat(path) if path != "/" else {"mode": _MODE_DIR}
        if st is not None and st["mode"] & _MODE_DIR:
            raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", path)
        new_dirs: list[str] = []
        if st is not None:
            base = posixpath.dirname(path)
        else:
            base, new_dirs = self._existing_ancestor(posixpath.dirname(path))
        if new_dirs and not parents:
            raise FileNotFoundError(errno.ENOENT, "no such directory in the sandbox", new_dirs[-1])
        try:
            self._api.put_archive(self._id, base, _file_tar(base, new_dirs, path, payload))
        except docker.errors.NotFound as exc:
            raise self._gone(exc) from exc

    def read_bytes(self, path: str) -> bytes:
        """Read a regular file (symlinks followed); directories raise IsADirectoryError.

        Bounded by ``Settings.transfer_max_file_bytes``: a larger file is refused on its
        size before any of it is fetched, and a file that grows meanwhile as it streams."""
        path = _abs_path(path)
        limits = self._limits
        for _ in range(_MAX_SYMLINK_HOPS):
            st = self._stat(path)
            if st is None:
                self._require_alive()
                raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", path)
            if st["mode"] & _MODE_DIR:
                raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", path)
            if st["mode"] & _MODE_SYMLINK:
                path = posixpath.normpath(posixpath.join(posixpath.dirname(path), st["linkTarget"]))
                continue
            limits.check_file(path, posixpath.basename(path), int(st.get("size") or 0))
            archive = io.BytesIO()
            try:
                self._stream(path, archive, limits.max_file_bytes + _TAR_OVERHEAD, "transfer_max_file_bytes")
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", path) from None
            return _single_file(archive, path)
        raise OSError(errno.ELOOP, "too many symlinks in the sandbox", path)

    def put_archive(self, data: bytes | bytearray | memoryview, path: str) -> None:
        """Extract the tar *data* into the existing directory *path* (entries relative to it).

        Entries keep the modes and owners their headers give; missing parents of an entry are
        created 0755 by root. One engine call: a missing *path* and a gone sandbox are told
        apart only when the call fails."""
        path = _abs_path(path)
        try:
            self._api.put_archive(self._id, path, bytes(data))
        except docker.errors.NotFound as exc:
            self._require_alive()
            raise FileNotFoundError(errno.ENOENT, "no such directory in the sandbox", path) from exc

    def get_archive(self, path: str) -> bytes:
        """A tar of *path* (a file, a directory tree, or a symlink itself, not followed), its
        entries named from ``basename(path)`` as ``docker cp`` does. One engine call.
        Bounded (``TransferLimits.max_archive_bytes``); `stream_archive` holds none of it."""
        archive = io.BytesIO()
        self.stream_archive(path, archive, self._limits.max_archive_bytes)
        return archive.getvalue()

    def stream_archive(self, path: str, into: BinaryIO, limit: int) -> int:
        """`get_archive` written to *into* as it streams, refused past *limit* bytes
        (`TransferLimitError`); returns the bytes written."""
        return self._stream(_abs_path(path), into, limit, "transfer_max_bytes")

    def _stream(self, path: str, into: BinaryIO, limit: int, setting: str) -> int:
        api = self._api
        try:
            resp = api._get(api._url("/containers/{0}/archive", self._id), params={"path": path}, stream=True)
            api._raise_for_status(resp)
        except docker.errors.NotFound as exc:
            self._require_alive()
            raise FileNotFoundError(errno.ENOENT, "no such file or directory in the sandbox", path) from exc
        try:
            return copy_into(resp.iter_content(_CHUNK), into, limit=limit, transfer=path, setting=setting)
        finally:
            resp.close()
