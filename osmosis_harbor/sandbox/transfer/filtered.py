"""Harbor's filtered directory downloads (``download_dir_filtered``, ``..._with_exclusions``)
with our host side: the same sandbox-side ``find`` / ``tar czf`` commands, the archive
fetched through the environment's own bounded ``download_file``, and extracted by our
extractor instead of ``tarfile.extractall``.

Harbor runs these when a trial's agent config names ``include_logs`` / ``exclude_logs``, or
an artifact has ``exclude`` patterns.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
import uuid
from collections.abc import Sequence
from logging import Logger
from pathlib import Path
from typing import Any, Protocol

from harbor.utils.path_filter import filter_paths_by_patterns

from osmosis_harbor.harbor_compat.skypilot_names import ENV_TRANSFER_TAR_DIR, TRANSFER_PACK_TIMEOUT_SEC
from osmosis_harbor.harbor_compat.tar_pack import pack_succeeded
from osmosis_harbor.sandbox.transfer.extract import TransferLimits, extract_archive

__all__ = ["HarborCalls", "download_filtered", "download_with_exclusions"]


class HarborCalls(Protocol):
    """What these downloads ask of an environment: Harbor's public ``BaseEnvironment`` calls only
    (each goes through the environment's own command pipeline and transfer router)."""

    logger: Logger

    async def exec(
        self,
        command: str,
        cwd: str | None = ...,
        env: dict[str, str] | None = ...,
        timeout_sec: int | None = ...,
        user: Any = ...,
    ) -> Any: ...

    async def service_exec(self, command: str, *, service: str | None, timeout_sec: int, user: Any) -> Any: ...

    async def service_download_file(self, *, source_path: str, target_path: Path, service: str | None) -> None: ...

    async def upload_file(self, source_path: Path | str, target_path: str) -> None: ...


def _remote(suffix: str) -> str:
    return str(ENV_TRANSFER_TAR_DIR / f".hb-transfer-{uuid.uuid4()}.{suffix}")


async def _fetch_and_extract(
    env: HarborCalls, remote: str, source_dir: str, target: Path, service: str | None, limits: TransferLimits
) -> None:
    with tempfile.TemporaryDirectory() as host_tmp:
        local = Path(host_tmp) / "transfer.tar.gz"
        await env.service_download_file(source_path=remote, target_path=local, service=service)
        with local.open("rb") as archive:
            await asyncio.to_thread(
                extract_archive, archive, target, transfer=source_dir, limits=limits, logger=env.logger
            )


async def download_with_exclusions(
    env: HarborCalls,
    limits: TransferLimits,
    *,
    source_dir: str,
    target_dir: Path | str,
    exclude: list[str],
    service: str | None,
) -> None:
    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    flags = " ".join(f"--exclude={shlex.quote(pattern)}" for pattern in exclude)
    remote = _remote("tar.gz")
    result = await env.service_exec(
        f"tar czf {shlex.quote(remote)} {flags} -C {shlex.quote(source_dir)} .",
        service=service,
        timeout_sec=TRANSFER_PACK_TIMEOUT_SEC,
        user="root",
    )
    try:
        if not pack_succeeded(result.return_code, stdout=result.stdout, stderr=result.stderr, logger=env.logger):
            raise RuntimeError(
                f"Failed to create transfer archive for {source_dir!r} with code {result.return_code}: "
                f"{result.stderr or result.stdout or 'no output'}"
            )
        await _fetch_and_extract(env, remote, source_dir, target, service, limits)
    finally:
        await env.service_exec(f"rm -f {shlex.quote(remote)}", service=service, timeout_sec=120, user="root")


async def download_filtered(
    env: HarborCalls,
    limits: TransferLimits,
    *,
    source_dir: str,
    target_dir: Path | str,
    include: Sequence[str] | None,
    exclude: Sequence[str] | None,
    protect: Sequence[str] | None,
) -> None:
    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    listed = await env.exec(f"cd {shlex.quote(source_dir)} && find . -type f", timeout_sec=120, user="root")
    if listed.return_code != 0:
        raise RuntimeError(
            f"Failed to list files in {source_dir!r} with code {listed.return_code}: "
            f"{listed.stderr or listed.stdout or 'no output'}"
        )
    paths = [line.removeprefix("./") for line in (listed.stdout or "").splitlines() if line.strip()]
    selected = filter_paths_by_patterns(paths, include=include, exclude=exclude)
    missing = set(protect or ()) - set(selected)
    selected += [path for path in paths if path in missing]
    if not selected:
        env.logger.warning(
            f"No files in {source_dir!r} matched include={include} exclude={exclude}; downloading nothing"
        )
        return
    remote, remote_list = _remote("tar.gz"), _remote("list")
    try:
        with tempfile.TemporaryDirectory() as host_tmp:
            host_list = Path(host_tmp) / "files.list"
            host_list.write_text("\n".join(selected) + "\n")
            await env.upload_file(source_path=host_list, target_path=remote_list)
        packed = await env.exec(
            f"tar czf {shlex.quote(remote)} -C {shlex.quote(source_dir)} -T {shlex.quote(remote_list)}",
            timeout_sec=TRANSFER_PACK_TIMEOUT_SEC,
            user="root",
        )
        if not pack_succeeded(packed.return_code, stdout=packed.stdout, stderr=packed.stderr, logger=env.logger):
            raise RuntimeError(
                f"Failed to create filtered transfer archive for {source_dir!r} with code {packed.return_code}: "
                f"{packed.stderr or packed.stdout or 'no output'}"
            )
        await _fetch_and_extract(env, remote, source_dir, target, None, limits)
    finally:
        await env.exec(f"rm -f {shlex.quote(remote)} {shlex.quote(remote_list)}", timeout_sec=120, user="root")
