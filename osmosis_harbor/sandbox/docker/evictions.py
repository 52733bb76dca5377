"""Sandboxes this process evicted for their disk use, kept until terminated, as kubelet keeps an
evicted pod: listed by ``ls()`` with status ``evicted`` and kubelet's message (or, past the inode
bound, which Kubernetes has no per-pod word for, ours in its form), so whoever asks why a sandbox
stopped learns it passed its own bound (the workflow's doing, not a lost node).

Held in this process's memory: the watcher that evicts (``disk_watch``) runs in the process
that created or claimed the sandbox, which is the process its owner asks (the host on the
Docker path; the emulator's server, whose ``ls`` its clients call, on the emulator path).
"""

from __future__ import annotations

import collections
import threading
import time

from osmosis_harbor.sandbox.docker.labels import ContainerInfo, SandboxRecord
from osmosis_harbor.sandbox.docker.layer import LayerUsage

__all__ = ["EVICTED", "Evictions", "inode_limit_message", "limit_message", "storage_limit_message"]

EVICTED = "evicted"
# Kept at most this many (the oldest go first): a host that never terminates what was evicted.
MAX_KEPT = 4096
MIB = 1024 * 1024


def storage_limit_message(used: int, bound: int) -> str:
    """kubelet's words for a container evicted past its ephemeral-storage limit, with the figures."""
    return (
        f'Container sandbox exceeded its local ephemeral storage limit "{bound // MIB}Mi": its writable '
        f"layer held {used / MIB:.0f} MiB (OSMOSIS_HARBOR_SANDBOX_DISK_MB)"
    )


def inode_limit_message(used: int, bound: int) -> str:
    """The same, past the inode bound (the walk stops once past it: ``used`` is at least that)."""
    return (
        f'Container sandbox exceeded its local ephemeral storage inode limit "{bound}": its writable layer '
        f"held at least {used} files, directories and links (OSMOSIS_HARBOR_SANDBOX_INODES)"
    )


def limit_message(used: LayerUsage, bound: LayerUsage) -> str:
    """The message for whichever bound ``used`` passed (the bytes' first)."""
    if bound.bytes and used.bytes > bound.bytes:
        return storage_limit_message(used.bytes, bound.bytes)
    return inode_limit_message(used.inodes, bound.inodes)


class Evictions:
    """Evicted sandboxes' records by container id (thread-safe: the watcher adds, callers read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: collections.OrderedDict[str, SandboxRecord] = collections.OrderedDict()

    def add(self, info: ContainerInfo, message: str) -> SandboxRecord:
        record = info.to_record().model_copy(update={"status": EVICTED, "status_message": message})
        with self._lock:
            self._records[info.id] = record
            while len(self._records) > MAX_KEPT:
                self._records.popitem(last=False)
        return record

    def listing(self, listed: list[ContainerInfo]) -> list[SandboxRecord]:
        """``listed`` as records, an evicted one (still being removed) as its eviction, plus the
        evictions whose container is gone: not past their TTL, their name not taken again."""
        now = time.time()
        with self._lock:
            kept = dict(self._records)
        records = [kept.get(info.id) or info.to_record() for info in listed]
        names = {info.name for info in listed}
        ids = {info.id for info in listed}
        records += [
            r
            for key, r in kept.items()
            if key not in ids and r.name not in names and (r.expires_at is None or r.expires_at > now)
        ]
        return records

    def named(self, name: str) -> SandboxRecord | None:
        with self._lock:
            return next((r for r in self._records.values() if r.name == name), None)

    def get(self, container_id: str) -> SandboxRecord | None:
        with self._lock:
            return self._records.get(container_id)

    def forget(self, *, container_id: str | None = None, name: str | None = None) -> None:
        """Drop the eviction of a sandbox being terminated (by its id, or by its name)."""
        with self._lock:
            for key, record in list(self._records.items()):
                if key == container_id or record.name == name:
                    del self._records[key]
