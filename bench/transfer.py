"""Transfer out of a sandbox: 100,000 small files against the same bytes in one file.

Why: every byte a sandbox sends back goes through our own extractor (``sandbox/transfer/extract``:
dir fds, ``O_NOFOLLOW | O_EXCL``, bounds), and a tree of many small files is where its
per-entry cost shows. The one-file
transfer of the same bytes is the baseline; the ratio is the per-entry overhead.

How: a sandbox of the template task holds ``/logs/agent`` as N files of 100 bytes (made by
``split``) or as one file of N x 100 bytes; ``download_dir("/logs/agent")`` is timed into a
fresh host directory, the snapshot dropped before each repeat (a command runs), on the default
route (an archive made of the SDK's own calls) and on Harbor's own path
(``OSMOSIS_HARBOR_EXEC_ARCHIVES=0``: pack, ``read_bytes``, our extraction). The
host extraction alone (a tar made on the host) shows what the sandbox side adds. The entry
bound is raised for the run (the default, 50,000 entries, would refuse 100,000 files).
"""

from __future__ import annotations

import io
import shutil
import tarfile
import time
import uuid
from pathlib import Path

from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor import settings
from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
from osmosis_harbor.sandbox.transfer.extract import TransferLimits, extract_archive

from .common import BenchResult
from .env import TEMPLATE, workdir

NAME = "transfer"
TITLE = "download_dir of N small files vs the same bytes in one file"
FILE_BYTES = 100


async def _environment(work: Path) -> SandboxEnvironment:
    task = Task(TEMPLATE)
    trial_paths = TrialPaths(work / "trial")
    trial_paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        environment_config("docker"),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"bench-transfer-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
    )
    assert isinstance(env, SandboxEnvironment)
    await env.start(force_build=False)
    return env


async def _sh(env: SandboxEnvironment, command: str) -> None:
    result = await env.exec(command, user="root", timeout_sec=600)
    if result.return_code != 0:
        raise RuntimeError(f"{command!r} failed: {result.stderr}")


async def _timed_downloads(env: SandboxEnvironment, work: Path, repeats: int) -> list[float]:
    samples = []
    for i in range(repeats):
        await _sh(env, "true")  # a command: the next read fetches afresh
        target = work / f"down-{i}"
        started = time.perf_counter()
        await env.download_dir("/logs/agent", target)
        samples.append(time.perf_counter() - started)
        shutil.rmtree(target)
    return samples


def _host_only(work: Path, n: int, repeats: int) -> tuple[list[float], list[float]]:
    def archive(many: bool) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for i in range(n if many else 1):
                info = tarfile.TarInfo(f"agent/f{i:06d}" if many else "agent/one.bin")
                info.size = FILE_BYTES if many else FILE_BYTES * n
                tar.addfile(info, io.BytesIO(b"x" * info.size))
        return out.getvalue()

    results: tuple[list[float], list[float]] = ([], [])
    limits = TransferLimits.of(settings.current())
    for samples, data in zip(results, (archive(True), archive(False)), strict=True):
        for i in range(repeats):
            target = work / f"host-{i}"
            started = time.perf_counter()
            extract_archive(io.BytesIO(data), target, transfer="bench", limits=limits, subtree="agent")
            samples.append(time.perf_counter() - started)
            shutil.rmtree(target)
    return results


async def run(quick: bool) -> BenchResult:
    n, repeats = (20_000, 2) if quick else (100_000, 2)
    result = BenchResult(NAME, TITLE)
    result.info["files"] = n
    result.info["bytes per file"] = FILE_BYTES
    work = workdir(NAME)
    with settings.scoped_variable("OSMOSIS_HARBOR_TRANSFER_MAX_FILES", str(2 * n)):
        for path, exec_archives in (("archive", "1"), ("harbor", "0")):
            with settings.scoped_variable("OSMOSIS_HARBOR_EXEC_ARCHIVES", exec_archives):
                env = await _environment(work / path)  # the route is chosen once per sandbox
                try:
                    await _sh(
                        env,
                        f"rm -rf /logs/agent && mkdir -p /logs/agent && head -c {n * FILE_BYTES} /dev/zero > /logs/agent/one.bin",
                    )
                    one = result.add(
                        f"{path}: one file of {n * FILE_BYTES} bytes",
                        "s",
                        await _timed_downloads(env, work, repeats),
                        baseline=True,
                    )
                    await _sh(
                        env,
                        f"rm -rf /logs/agent && mkdir -p /logs/agent && cd /logs/agent && head -c {n * FILE_BYTES} /dev/zero | split -b {FILE_BYTES} -a 6 - f",
                    )
                    many = result.add(
                        f"{path}: {n} files of {FILE_BYTES} bytes", "s", await _timed_downloads(env, work, repeats)
                    )
                    ratio = result.ratio(f"{path}: {n} files / one file", many, one)
                    result.headline_value(f"transfer_{path}_files_ratio", ratio.value)
                    result.headline_value(f"transfer_{path}_files_sec", many.median)
                finally:
                    await env.stop(delete=True)
        host_many, host_one = _host_only(work, n, repeats)
    one = result.add(f"host extraction only: one file of {n * FILE_BYTES} bytes", "s", host_one, baseline=True)
    many = result.add(f"host extraction only: {n} files", "s", host_many)
    result.ratio(f"host extraction: {n} files / one file", many, one)
    shutil.rmtree(work, ignore_errors=True)
    result.notes.append(
        "a regular file costs a create, a write, a chmod, an mtime and a close on the host, and a "
        "header parse (tarfile, pure Python): that floor, not the bytes, sets the many-files figure"
    )
    return result
