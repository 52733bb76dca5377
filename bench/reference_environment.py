"""A plain Harbor environment on the local Docker engine, on docker-py's defaults: the incumbent's.

Why: the side-by-side benchmark (``bench.incumbent``) must not run osmosis-ai 0.3.8 on our
sandbox layer, or every cut we make there lowers its column too. Its own environments cannot run
here (Harbor's ``docker`` needs the compose v2 plugin, Harbor's ``skypilot`` needs ``sky.sandbox``),
so this is the closest honest stand-in: what a user would write against docker-py in an
afternoon. One container per environment (``sleep infinity``), built from the task's Dockerfile
with the engine's classic builder, each command one ``exec_run`` (``bash -c``, the user, workdir
and environment passed to the engine), transfers as one ``put_archive`` / ``get_archive``, the
container removed at stop. No pools, no write-behind, no snapshots, no relay: the container is on
docker-py's default network (the engine's default bridge), and the benchmark's policy for the
incumbent listens on that bridge's gateway (``default_bridge_gateway``), which the container
reaches as Harbor's own Docker and SkyPilot environments' sandboxes reach a policy: over a network
namespace of their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import ipaddress
import tarfile
import threading
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import require_agent_environment_definition

__all__ = ["IMPORT_PATH", "LABEL", "ReferenceDockerEnvironment", "default_bridge_gateway"]

IMPORT_PATH = "bench.reference_environment:ReferenceDockerEnvironment"
LABEL = "osmosis-harbor.bench-reference"  # every container it makes: a bench's leftover check finds them
_BUILD_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def default_bridge_gateway() -> str:
    """The address of the engine's default bridge on this machine (``docker0``'s), where a
    container on docker-py's default network reaches the host: its IPAM gateway, or, where the
    engine does not list one (the default bridge often does not), the subnet's first address,
    which the engine gives the bridge."""
    try:
        config = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"]
        entry = next(c for c in config if c.get("Gateway") or c.get("Subnet"))
        return str(entry.get("Gateway") or next(ipaddress.ip_network(entry["Subnet"]).hosts()))
    except (docker.errors.NotFound, StopIteration, KeyError, TypeError) as exc:
        raise RuntimeError(
            "the Docker engine has no default bridge with a gateway (dockerd --bridge=none?): "
            "the incumbent's reference environment runs its containers there"
        ) from exc


def _dir_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _tar_of(source: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(source, arcname=arcname)
    return buffer.getvalue()


class ReferenceDockerEnvironment(BaseEnvironment):
    """One docker-py container per trial environment (see the module docstring)."""

    @staticmethod
    def type() -> str:
        return "bench-reference-docker"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()

    def _validate_definition(self) -> None:
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client = docker.from_env()
        self._container: Any | None = None

    # ── lifecycle ──────────────────────────────────────────────────────────────

    async def start(self, force_build: bool) -> None:
        image = await asyncio.to_thread(self._image, force_build)
        self._container = await asyncio.to_thread(self._run, image)
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    def _image(self, force_build: bool) -> str:
        dockerfile = self.environment_dir / "Dockerfile"
        if self.task_env_config.docker_image and not dockerfile.is_file():
            return self.task_env_config.docker_image
        tag = f"bench-reference/{self.environment_name.lower()}:{_dir_hash(self.environment_dir)}"
        with _LOCKS_GUARD:
            lock = _BUILD_LOCKS.setdefault(tag, threading.Lock())
        with lock:  # concurrent trials of one task build it once
            try:
                if not force_build:
                    self._client.images.get(tag)
                    return tag
            except docker.errors.ImageNotFound:
                pass
            self._client.images.build(path=str(self.environment_dir), tag=tag, rm=True)
        return tag

    def _run(self, image: str) -> Any:
        config = self.task_env_config
        limits: dict[str, Any] = {}
        if config.cpus:
            limits["nano_cpus"] = int(config.cpus * 1e9)
        if config.memory_mb:
            limits["mem_limit"] = f"{config.memory_mb}m"
        return self._client.containers.run(
            image,
            ["sleep", "infinity"],
            name=f"bench-ref-{uuid.uuid4().hex[:12]}",
            detach=True,
            labels={LABEL: "1"},
            environment=self._persistent_env or None,
            **limits,
        )

    async def stop(self, delete: bool) -> None:
        container, self._container = self._container, None
        if container is not None:
            await asyncio.to_thread(container.remove, force=True)

    # ── commands ───────────────────────────────────────────────────────────────

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        container = self._require()
        resolved = self._resolve_user(user)
        argv = ["bash", "-c", command]
        if timeout_sec is not None:
            argv = ["timeout", str(int(timeout_sec)), *argv]
        result = await asyncio.to_thread(
            container.exec_run,
            argv,
            user="" if resolved is None else str(resolved),
            workdir=cwd or self.task_env_config.workdir or None,
            environment=self._merge_env(env) or None,
            demux=True,
        )
        out, err = result.output
        return ExecResult(
            stdout=(out or b"").decode(errors="replace"),
            stderr=(err or b"").decode(errors="replace"),
            return_code=result.exit_code,
        )

    # ── transfers ──────────────────────────────────────────────────────────────

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source, target = Path(source_path), Path(target_path)
        await self.exec(f"mkdir -p '{target.parent}'", user="root")
        data = _tar_of(source, target.name)
        await asyncio.to_thread(self._require().put_archive, str(target.parent), data)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.exec(f"mkdir -p '{target_dir}'", user="root")
        data = _tar_of(Path(source_dir), ".")
        await asyncio.to_thread(self._require().put_archive, target_dir, data)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=await self._archive(source_path)) as tar:
            member = next(m for m in tar.getmembers() if m.isfile())
            extracted = tar.extractfile(member)
            assert extracted is not None
            target.write_bytes(extracted.read())

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=await self._archive(source_dir)) as tar:
            members = []
            for member in tar.getmembers():  # the archive's top is the directory's own name
                parts = Path(member.name).parts[1:]
                if parts:
                    member.name = str(Path(*parts))
                    members.append(member)
            tar.extractall(target, members=members, filter="data")

    async def _archive(self, path: str) -> io.BytesIO:
        def fetch() -> io.BytesIO:
            stream, _ = self._require().get_archive(path)
            return io.BytesIO(b"".join(stream))

        try:
            return await asyncio.to_thread(fetch)
        except docker.errors.NotFound as exc:
            raise FileNotFoundError(path) from exc

    def _require(self) -> Any:
        if self._container is None:
            raise RuntimeError("the reference environment has no container: start it first")
        return self._container
