"""The writable-layer bounds of one engine's sandboxes: which enforcement applies, and its state.

The engine enforces ``--storage-opt size=`` where its storage can (overlay2 on xfs with
``pquota``, btrfs, zfs): the first create asks for it, and an engine that refuses it is never
asked again. Elsewhere (overlay2 on ext4, as here) the host's ``disk_watch`` bounds each sandbox
this process starts or claims, which needs the engine's storage readable from this process (a
local engine, root); where it is not, the bound is not enforced and one warning says so. The
inode bound is the watch's on every engine: the size option is a block quota only.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors
from docker import APIClient

from osmosis_harbor.sandbox.docker.disk_watch import DiskWatch
from osmosis_harbor.sandbox.docker.evictions import Evictions, limit_message
from osmosis_harbor.sandbox.docker.labels import ContainerInfo
from osmosis_harbor.sandbox.docker.layer import LayerUsage
from osmosis_harbor.sandbox.sdk.bounds import SandboxBounds

__all__ = ["LayerBound"]

log = logging.getLogger(__name__)


class LayerBound:
    """Per engine: the quota decision, the watch, and the sandboxes it evicted."""

    def __init__(
        self,
        api: APIClient,
        *,
        engine_url: str,
        storage_root: str,
        inspect: Callable[[str], ContainerInfo | None],
        remove: Callable[[str, bool], object],
    ) -> None:
        self._quota: bool | None = None  # the engine enforces the size option (None: not asked yet)
        self._readable: bool | None = _readable(engine_url, storage_root)  # None: warned already
        self._inspect = inspect
        self._remove = remove
        self._pending: dict[str, LayerUsage] = {}  # created container id -> bound to watch once started
        self._lock = threading.Lock()
        self.evictions = Evictions()
        self.watch = DiskWatch(api, self._evict, filesystem=Path(storage_root or "/"))

    def option(self, bounds: SandboxBounds) -> dict[str, str] | None:
        """``storage_opt`` for a create: asked of the engine until it has refused it once."""
        if not bounds.disk_bytes or self._quota is False:
            return None
        return {"size": f"{bounds.disk_mb}M"}

    def refused(self, exc: docker.errors.APIError, host_config: dict[str, Any]) -> bool:
        """The engine refused the size option: never asked again (True: create once more)."""
        if not host_config.get("StorageOpt") or "storage-opt" not in str(exc.explanation or exc).lower():
            return False
        log.info("this engine cannot bound a container's writable layer (%s): the host watches it", exc)
        self._quota = False
        return True

    def created(self, container_id: str, bounds: SandboxBounds) -> None:
        """A create went through: with the size option the engine enforces the bytes, else the
        watch does; the watch bounds the inodes either way."""
        with self._lock:
            if bounds.disk_bytes and self._quota is None:
                self._quota = True
            watched = self._watched(bounds.disk_bytes, bounds.inodes)
            if watched.bytes or watched.inodes:
                self._pending[container_id] = watched

    def started(self, container_id: str) -> None:
        with self._lock:
            bound = self._pending.pop(container_id, None)
        if bound is not None and self._can_watch():
            self.watch.watch(container_id, bound)

    def claimed(self, container_id: str, *, disk_mb: int, inodes: int) -> None:
        """A pool member this process claimed (another process may have started it), watched
        at the bounds the claim's config gives."""
        bound = self._watched(disk_mb * 1024 * 1024, inodes)
        if (bound.bytes or bound.inodes) and self._can_watch():
            self.watch.watch(container_id, bound)

    def _watched(self, disk_bytes: int, inodes: int) -> LayerUsage:
        """What the watch bounds: the bytes unless the engine enforces them, and the inodes."""
        return LayerUsage(bytes=0 if self._quota is True else disk_bytes, inodes=inodes)

    def removed(self, container_id: str) -> None:
        with self._lock:
            self._pending.pop(container_id, None)
        self.watch.forget(container_id)

    def _can_watch(self) -> bool:
        if self._readable is False:
            log.warning(
                "the writable layer of local sandboxes cannot be read from this process (a remote engine, or "
                "not root): OSMOSIS_HARBOR_SANDBOX_DISK_MB (but for each file's size) and "
                "OSMOSIS_HARBOR_SANDBOX_INODES are not enforced"
            )
            self._readable = None
        return bool(self._readable)

    def _evict(self, container_id: str, used: LayerUsage, bound: LayerUsage) -> None:
        """The watch found this layer past a bound: evict the sandbox, as kubelet would a pod."""
        info = self._inspect(container_id)
        if info is None:
            return
        message = limit_message(used, bound)
        if not info.is_idle_member:
            self.evictions.add(info, message)
        log.warning("evicting sandbox %s: %s", info.name, message)
        self._remove(container_id, info.pool is not None)


def _readable(url: str, root: str) -> bool:
    """A local engine (Unix socket) whose storage directory this process may read."""
    return url.startswith("unix://") and bool(root) and os.access(root, os.R_OK | os.X_OK)
