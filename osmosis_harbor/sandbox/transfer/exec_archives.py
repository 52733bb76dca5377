"""The archive capability built from SkyPilot's own calls: a file write or read plus one command.

Why: SkyPilot's SDK offers no ``put_archive`` / ``get_archive``, so Harbor's transfer path
moves each directory with three calls (write + unpack command + ``rm`` command, or pack
command + read + ``rm``), and a graded rollout makes about nine such transfers: the agent's
logs down, the same logs back up, the artifacts probed and fetched three times, the verifier's
uploads, its logs down. Every call is a round trip to the SkyPilot API server. Giving
``transfers.ArchiveTransfers`` (write-behind uploads, one shared snapshot of ``/logs``) two
primitives made of the calls SkyPilot has brings that to a handful of calls:

* **put**: the staged tar, gzipped, written to a temp file in the sandbox, then one command, as
  root, unpacks it at ``/`` and removes it (2 calls, for every upload staged since the last
  command);
* **get** (and **get_together**, several paths in one archive): one command packs the path
  into a gzipped temp file and prints its size, which is
  checked against ``max_archive_bytes`` *before* the read (SkyPilot's read hands the whole file
  over); the read is checked again on arrival (a process left running in the sandbox could grow
  the file in between), and unzipped on the host into the snapshot's temp file within the same
  bound, so a small archive cannot unzip into a flood. The archive is removed by the next
  command this module runs, or goes with the sandbox: no third call.

Both ways are gzipped, as Harbor's own transfers are: log trees shrink several-fold, which is
what crosses the API and what sits in the sandbox's ``/tmp`` (a bounded tmpfs on some SDKs)
meanwhile.

The archive has the shape the Docker SDK's ``get_archive`` gives (members named from the
path's own name, a top symlink not followed), so the same snapshot and our own extractor read
it. A path that is not there is ``FileNotFoundError``, as there. What the sandbox sends stays
hostile input: the size it prints only bounds, and the tar goes through ``sandbox/extract``.
``OSMOSIS_HARBOR_EXEC_ARCHIVES=0`` keeps Harbor's own transfer path.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import posixpath
import shlex
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import BinaryIO

from harbor.environments.base import ExecResult

from osmosis_harbor.errors import UnreadableArchiveError
from osmosis_harbor.sandbox.transfer.downloads import reported_size
from osmosis_harbor.sandbox.transfer.exec_folds import FoldedPack, Trailer, UploadFold
from osmosis_harbor.sandbox.transfer.extract import TransferLimits

__all__ = ["MISSING_EXIT_CODE", "ExecArchives"]

TRANSFER_DIR = "/tmp"  # where Harbor's SkyPilot path stages its archives too
MISSING_EXIT_CODE = 44  # the pack command's answer for a path that is not there
PACK_TIMEOUT_SEC = 120
UNPACK_TIMEOUT_SEC = 120
GZIP_LEVEL = 1  # the host's CPU matters more than the last bytes of a log tree
CHUNK = 1 << 20

_EMPTY_TAR = bytes(10240)  # a tar of no members: two zero blocks, padded to one record
RunShell = Callable[[str, int], Awaitable[ExecResult]]
WriteBytes = Callable[[bytes, str], Awaitable[None]]
ReadBytes = Callable[[str], Awaitable[bytes]]


def _gunzip_bounded(data: bytes, into: BinaryIO, path: str, limits: TransferLimits) -> None:
    """Unzip ``data`` into ``into``, refusing it once the tar passes ``max_archive_bytes``."""
    written = 0
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as unzipped:
            while chunk := unzipped.read(CHUNK):
                written += len(chunk)
                limits.check_archive(path, written)
                into.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise UnreadableArchiveError(path, exc) from None


class ExecArchives:
    """``put`` / ``get`` of one sandbox over its shell, file write and file read calls.

    ``run_shell`` runs a raw command as root and must not itself flush or invalidate the
    transfers (it is called from inside them)."""

    def __init__(
        self, run_shell: RunShell, write_bytes: WriteBytes, read_bytes: ReadBytes, limits: TransferLimits
    ) -> None:
        self._run_shell = run_shell
        self._limits = limits
        self._write_bytes = write_bytes
        self._read_bytes = read_bytes
        self._stale: list[str] = []  # fetched archives still in the sandbox, removed by the next command

    def _remote(self, kind: str) -> str:
        return f"{TRANSFER_DIR}/osmosis-{kind}-{uuid.uuid4().hex}.tar.gz"

    def _clear_stale(self) -> str:
        """The prefix that removes archives fetched earlier (forgotten once it is sent)."""
        if not self._stale:
            return ""
        prefix = f"rm -f {' '.join(shlex.quote(p) for p in self._stale)}; "
        self._stale = []
        return prefix

    async def put(self, data: bytes, path: str) -> None:
        """Unpack the tar ``data`` at sandbox ``path`` (an existing directory), as root."""
        await self.put_after(data, path, "")

    async def put_after(self, data: bytes | None, path: str, prefix: str) -> None:
        """``put``, after the root shell ``prefix`` (``... && ``) in the same command: a
        preparation of the upload's targets costs no command of its own. ``data`` None: only
        the prefix runs. The prefix failing fails the put, and nothing is unpacked."""
        if data is None:
            command = f"{self._clear_stale()}{prefix}:"
        else:
            remote = self._remote("put")
            await self._write_bytes(await asyncio.to_thread(gzip.compress, data, GZIP_LEVEL), remote)
            target, archive = shlex.quote(path), shlex.quote(remote)
            unpack = f"tar -xzf {archive} -C {target}"
            command = f"{self._clear_stale()}{{ {prefix}{unpack}; }}; code=$?; rm -f {archive}; exit $code"
        result = await self._run_shell(command, UNPACK_TIMEOUT_SEC)
        if result.return_code != 0:
            what = "prepare and unpack" if prefix else "unpack"
            raise RuntimeError(
                f"Failed to {what} an upload into {path!r} in the sandbox (exit {result.return_code}): "
                f"{(result.stderr or result.stdout or 'no output').strip()[:500]}"
            )

    # ── folds: the transfers that ride a command's own exec (``exec_folds.py``) ─────────
    async def upload_fold(self, data: bytes | None, preparation: str) -> UploadFold:
        """Write the staged ``data`` (a tar; None: only ``preparation`` runs) for the next
        command to unpack at ``/`` before it runs, after the root shell ``preparation``."""
        fold = UploadFold.new(self._remote("put"), self._clear_stale() + (preparation or ":"))
        tar = data if data is not None else _EMPTY_TAR
        await self._write_bytes(fold.payload(await asyncio.to_thread(gzip.compress, tar, GZIP_LEVEL)), fold.remote)
        return fold

    def pack_fold(self, roots: tuple[str, ...]) -> FoldedPack:
        """The pack of ``roots`` to run right after the next command."""
        return FoldedPack(roots, self._remote("get"), uuid.uuid4().hex[:12])

    async def adopt(self, pack: FoldedPack, trailer: Trailer, into: BinaryIO) -> None:
        """The archive the pack after a command made, unzipped into ``into`` within the bounds
        (the read only when it was not delivered inline)."""
        label = ", ".join(trailer.present)
        if trailer.data is None:
            self._stale.append(pack.remote)
        await self._receive(trailer.data, pack.remote, trailer.size, into, label)

    def forget_pack(self, pack: FoldedPack) -> None:
        """A pack after a command that was not adopted: its archive goes with the next command."""
        self._stale.append(pack.remote)

    async def get_together(self, paths: list[str], into: BinaryIO) -> list[str]:
        """One tar of several sandbox paths (members named from ``/``) written to ``into``,
        bounded as ``get``; returns the paths that were there. The first must be there
        (``FileNotFoundError``); the others are packed when they are."""
        names = [p.strip("/") for p in paths]
        if not all(names):
            raise ValueError("the sandbox's root cannot be fetched whole; name directories under it")
        members = " ".join(shlex.quote(n if not n.startswith("-") else f"./{n}") for n in names)
        first = shlex.quote("/" + names[0])
        remote = self._remote("get")
        archive = shlex.quote(remote)
        command = (
            f"{self._clear_stale()}"
            f"if [ ! -e {first} ] && [ ! -L {first} ]; then exit {MISSING_EXIT_CODE}; fi; set --; "
            f'for p in {members}; do if [ -e "/$p" ] || [ -L "/$p" ]; then set -- "$@" "$p"; fi; done; '
            f'tar -czf {archive} -C / "$@"; [ $? -le 1 ] && [ -f {archive} ] && '
            f'{{ printf "%s\n" "$@"; wc -c < {archive}; }}'
        )
        label = ", ".join(paths)
        result = await self._fetch_packed(command, remote, into, first=paths[0], label=label, shown=label)
        said = {line.strip().removeprefix("./") for line in (result.stdout or "").splitlines()[:-1]}
        return [path for path, name in zip(paths, names, strict=True) if name in said]

    async def get(self, path: str, into: BinaryIO) -> None:
        """The tar of sandbox ``path`` (named from its own name) written to ``into``, bounded."""
        parent, name = posixpath.split(path.rstrip("/") or "/")
        if not name:
            raise ValueError("the sandbox's root cannot be fetched whole; name a directory under it")
        remote, quoted = self._remote("get"), shlex.quote(path)
        archive = shlex.quote(remote)
        member = shlex.quote(name if not name.startswith("-") else f"./{name}")
        command = (
            f"{self._clear_stale()}"
            f"if [ ! -e {quoted} ] && [ ! -L {quoted} ]; then exit {MISSING_EXIT_CODE}; fi; "
            # GNU tar exits 1 for a file that changed while it was read (a process still writing a
            # log): the archive is whole, as the Docker SDK's would be; anything worse fails.
            f"tar -czf {archive} -C {shlex.quote(parent)} {member}; [ $? -le 1 ] && [ -f {archive} ] && wc -c < {archive}"
        )
        await self._fetch_packed(command, remote, into, first=path, label=path, shown=repr(path))

    async def _fetch_packed(
        self, command: str, remote: str, into: BinaryIO, *, first: str, label: str, shown: str
    ) -> ExecResult:
        """Run the pack ``command`` (archive at ``remote``, its size on stdout's last line), then
        read and unzip the archive into ``into``, bounded before the read and after it; the
        command's result. ``first``: the path a missing-path exit names."""
        result = await self._run_shell(command, PACK_TIMEOUT_SEC)
        self._stale.append(remote)
        if result.return_code == MISSING_EXIT_CODE:
            raise FileNotFoundError(f"no such path in the sandbox: {first}")
        if result.return_code != 0:
            raise RuntimeError(
                f"Failed to pack {shown} in the sandbox (exit {result.return_code}): "
                f"{(result.stderr or result.stdout or 'no output').strip()[:500]}"
            )
        await self._receive(None, remote, reported_size(result) or 0, into, label)
        return result

    async def _receive(self, data: bytes | None, remote: str, size: int, into: BinaryIO, label: str) -> None:
        """A packed archive unzipped into ``into`` within the bounds: ``data`` as it came, or
        read from ``remote`` once the ``size`` the sandbox reported is within them."""
        limits = self._limits
        if data is None:
            limits.check_archive(label, size)
            data = await self._read_bytes(remote)
        limits.check_archive(label, len(data))
        await asyncio.to_thread(_gunzip_bounded, data, into, label, limits)
