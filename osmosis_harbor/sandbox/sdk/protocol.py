"""The ``sky.sandbox`` surface osmosis-harbor relies on, as a ``typing.Protocol``.

Harbor's ``SkypilotEnvironment`` and our own code call exactly these: module-level functions
(each blocking, each with an ``.aio`` coroutine twin) and a sandbox handle whose ``exec``
returns a handle to ``wait()`` on. SkyPilot's SDK and ``osmosis_harbor.sandbox.docker`` both
satisfy it; ``sandbox-check`` (``osmosis_harbor.sandbox.conformance``) proves they agree on
what it means.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

__all__ = ["ArchiveSandbox", "AsyncCall", "ExecHandle", "OutputReader", "SandboxHandle", "SandboxSdk", "has_archives"]


class AsyncCall[R](Protocol):
    """A blocking call that also offers ``.aio`` (the shape of every ``sky.sandbox`` call)."""

    def __call__(self, *args: Any, **kwargs: Any) -> R: ...

    @property
    def aio(self) -> Callable[..., Awaitable[R]]: ...


class OutputReader(Protocol):
    def read(self) -> str: ...


class ExecHandle(Protocol):
    """What ``await sandbox.exec.aio(*argv, ...)`` returns: ``await handle.wait()``, then read."""

    stdout: OutputReader
    stderr: OutputReader

    def wait(self) -> Awaitable[int]: ...


class SandboxHandle(Protocol):
    """A live sandbox."""

    @property
    def name(self) -> str: ...

    @property
    def exec(self) -> AsyncCall[Any]: ...

    @property
    def write_bytes(self) -> AsyncCall[None]: ...

    @property
    def read_bytes(self) -> AsyncCall[bytes]: ...

    @property
    def terminate(self) -> AsyncCall[None]: ...


class ArchiveSandbox(SandboxHandle, Protocol):
    """An optional capability: a whole directory tree in one call each way.

    ``put_archive.aio(tar_bytes, dir)`` extracts a tar into an existing directory;
    ``get_archive.aio(path)`` returns a tar of ``path`` whose entries are named from its
    basename. Harbor's own transfer costs three calls per directory (write, unpack exec,
    rm exec; or pack exec, read, rm exec), each a round trip to the SkyPilot API server, so
    ``SandboxEnvironment`` uses this when a sandbox handle offers it and Harbor's path when not.
    """

    @property
    def put_archive(self) -> AsyncCall[None]: ...

    @property
    def get_archive(self) -> AsyncCall[bytes]: ...


def has_archives(sandbox: object) -> bool:
    """Whether a sandbox handle offers the archive capability (`ArchiveSandbox`)."""
    return all(callable(getattr(getattr(sandbox, name, None), "aio", None)) for name in ("put_archive", "get_archive"))


class SandboxSdk(Protocol):
    """The module-level surface: sandboxes, their listing, and warm pools, as SkyPilot documents
    it (create, ls, create_pool, set_pool_size, delete_pool). What an SDK offers beyond it (the
    Docker SDK's ``get_pool``, ``list_pools``, ``terminate_by_name``) is asked for with
    ``getattr`` where it is used, with a path for the SDKs without it."""

    @property
    def create(self) -> AsyncCall[SandboxHandle]: ...

    @property
    def ls(self) -> AsyncCall[Sequence[Any]]: ...

    @property
    def create_pool(self) -> AsyncCall[Any]: ...

    @property
    def set_pool_size(self) -> AsyncCall[Any]: ...

    @property
    def delete_pool(self) -> AsyncCall[Any]: ...
