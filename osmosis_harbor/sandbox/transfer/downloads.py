"""Bounded downloads from a sandbox for ``SandboxEnvironment``, on either transfer path.

* Harbor's own path (with ``exec_archives`` off): the sandbox side is Harbor's (``tar
  -czf`` of the directory, ``read_bytes`` of the archive, ``rm``), with the archive's size
  asked in the same command so an oversized one is refused before it is read; the host side
  is our extractor instead of ``tarfile``. A single file's size is asked first for the same
  reason. ``read_bytes`` hands the whole file over, so the bound is only as good as the size
  the sandbox reports just before the read (a process left running in it could grow the
  file in between): its result is checked again on arrival.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from harbor.environments.base import ExecResult
from harbor.environments.tar_transfer import remote_pack_command

from osmosis_harbor.errors import TransferLimitError
from osmosis_harbor.harbor_compat.skypilot_names import REMOTE_TRANSFER_DIR
from osmosis_harbor.sandbox.transfer.extract import ExtractResult, TransferLimits, extract_archive, write_file
from osmosis_harbor.sandbox.transfer.snapshot import Logger

__all__ = ["HarborPath", "reported_size"]

RunShell = Callable[..., Awaitable[ExecResult]]
ReadBytes = Callable[[str], Awaitable[bytes]]


def reported_size(result: ExecResult) -> int | None:
    """The last line of a command's stdout as a byte count (``wc -c`` / ``stat -c %s``)."""
    lines = (result.stdout or "").strip().splitlines()
    try:
        return int(lines[-1].strip()) if lines else None
    except ValueError:
        return None


class HarborPath:
    """Harbor's sandbox-side transfer commands with our host side (see the module)."""

    def __init__(self, run_shell: RunShell, read_bytes: ReadBytes, logger: Logger, limits: TransferLimits) -> None:
        self._run_shell = run_shell
        self._limits = limits
        self._read_bytes = read_bytes
        self._logger = logger

    async def download_dir(self, source_dir: str, target_dir: Path) -> ExtractResult:
        limits = self._limits
        remote = f"{REMOTE_TRANSFER_DIR}/hb-download-{uuid.uuid4().hex}.tar.gz"
        try:
            pack = f"{remote_pack_command(source_dir, remote)} && wc -c < {shlex.quote(remote)}"
            result = await self._run_shell(pack, timeout_seconds=120)
            if result.return_code != 0:
                raise RuntimeError(f"Failed to pack directory in SkyPilot sandbox: {result.stdout} {result.stderr}")
            limits.check_archive(source_dir, reported_size(result) or 0)
            data = await self._read_bytes(remote)
            limits.check_archive(source_dir, len(data))
            return await asyncio.to_thread(
                extract_archive, io.BytesIO(data), target_dir, transfer=source_dir, limits=limits, logger=self._logger
            )
        finally:
            await self._run_shell(f"rm -f {shlex.quote(remote)}", timeout_seconds=30)

    async def download_file(self, source_path: str, target_path: Path) -> None:
        limits = self._limits
        probe = await self._run_shell(f"stat -L -c %s -- {shlex.quote(source_path)}", timeout_seconds=30)
        size = reported_size(probe) if probe.return_code == 0 else None
        if size is not None:
            limits.check_file(source_path, Path(source_path).name, size)
        data = await self._read_bytes(source_path)
        if len(data) > limits.max_file_bytes:
            raise TransferLimitError(
                source_path, "the file (bytes)", len(data), limits.max_file_bytes, "transfer_max_file_bytes"
            )
        target_path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(write_file, target_path, data)
