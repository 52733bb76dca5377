"""``DockerSandbox``: one live sandbox of the Docker emulation, the handle ``create`` returns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import BinaryIO

import docker.errors

from osmosis_harbor.errors import SandboxNotFoundError
from osmosis_harbor.sandbox.docker.engine import Engine
from osmosis_harbor.sandbox.docker.exec import (
    ExecMethod,
    ExecRun,
    check_env,
    exec_timeout,
)
from osmosis_harbor.sandbox.docker.files import SandboxFiles
from osmosis_harbor.sandbox.sdk.calls import dual, executor

__all__ = ["DockerSandbox"]


class DockerSandbox:
    """A live sandbox: a container plus the persistent env applied to every exec.

    The persistent env is merged into each exec rather than relying on the container's env, so
    a pool claim (whose container env was fixed before the claim) behaves like a fresh create.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        container_id: str,
        image: str,
        pool: str | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._engine = engine
        self._name = name
        self._id = container_id
        self._image = image
        self._pool = pool
        self._env = dict(env or {})

    def __repr__(self) -> str:
        return f"DockerSandbox(name={self._name!r}, id={self._id[:12]!r}, image={self._image!r}, pool={self._pool!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def id(self) -> str:
        return self._id

    @property
    def image(self) -> str:
        return self._image

    @property
    def pool(self) -> str | None:
        return self._pool

    @property
    def exec(self) -> ExecMethod:
        return ExecMethod(self)

    def _gone(self, exc: Exception) -> SandboxNotFoundError:
        return SandboxNotFoundError(f"sandbox {self._name!r} is gone (terminated, expired or reaped): {exc}")

    def launch(
        self,
        argv: Sequence[str],
        workdir: str | None,
        timeout_seconds: float | None,
        env: Mapping[str, str] | None,
    ) -> ExecRun:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("exec needs a non-empty argv of strings (no implicit shell)")
        timeout = exec_timeout(timeout_seconds)
        environment = {**self._env, **check_env(env or {})}
        api = self._engine.api
        try:
            exec_id = api.exec_create(
                self._id,
                list(argv),
                stdout=True,
                stderr=True,
                environment=environment or None,
                workdir=workdir or None,
            )["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=True)
        except docker.errors.NotFound as exc:
            raise self._gone(exc) from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # container not running
                raise self._gone(exc) from exc
            raise
        return ExecRun(self._engine, self._id, exec_id, stream, timeout)

    # files -------------------------------------------------------------------------------------

    def _files(self) -> SandboxFiles:
        return SandboxFiles(self._engine.api, self._id, self._gone, self._engine.config.transfers)

    @dual
    def write_bytes(self, data: bytes | bytearray | memoryview, path: str, *, parents: bool = True) -> None:
        """Write *data* to *path*, creating parent directories (mode 0755; file 0644); with
        ``parents=False`` a missing parent is ``FileNotFoundError``, as on SkyPilot."""
        self._files().write_bytes(data, path, parents=parents)

    @dual
    def read_bytes(self, path: str) -> bytes:
        """Read a regular file (symlinks followed); directories raise IsADirectoryError."""
        return self._files().read_bytes(path)

    @dual
    def put_archive(self, data: bytes | bytearray | memoryview, path: str) -> None:
        """Extract a tar archive into the existing directory *path*: a whole tree in one call."""
        self._files().put_archive(data, path)

    @dual
    def get_archive(self, path: str) -> bytes:
        """A tar of *path* (entries named from its basename): a whole tree in one call."""
        return self._files().get_archive(path)

    @dual
    def stream_archive(self, path: str, into: BinaryIO, limit: int) -> int:
        """``get_archive`` written to *into* as it streams, refused past *limit* bytes."""
        return self._files().stream_archive(path, into, limit)

    # lifecycle ---------------------------------------------------------------------------------

    @dual
    def terminate(self, wait: bool = True) -> None:
        """Remove the container (idempotent). ``wait=False`` returns before removal completes."""
        claimed = self._pool is not None
        self._engine.layers.evictions.forget(container_id=self._id)
        if wait:
            self._engine.remove_container(self._id, wait=True, claimed=claimed)
        else:
            executor().submit(self._engine.remove_container, self._id, claimed=claimed)

    @dual
    def status(self) -> str:
        """Engine state ("running", "exited", ...); once the container is gone, "evicted" (for its
        disk use) or "terminated"."""
        info = self._engine.inspect_info(self._id)
        if info is None:
            evicted = self._engine.layers.evictions.get(self._id)
            return evicted.status if evicted is not None else "terminated"
        return info.state
