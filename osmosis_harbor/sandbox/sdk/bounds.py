"""The resource bounds every sandbox gets, so that one rollout cannot take the host down.

Harbor 0.25 injects no CPU or memory value when a task names none (``cpus`` / ``memory_mb``
default to None, "the provider's default sizing"). We are the provider here, so we apply the
sizing Harbor documents for a task (``cpus = 1``, ``memory_mb = 2048``): the Harbor
environment passes it to whichever ``sky.sandbox`` SDK runs the trial, and the Docker
emulation applies it to any sandbox or pool member created without one.

What the Docker engine bounds beyond CPU and memory:

* a pid limit (a fork bomb stops at ``PIDS_LIMIT`` tasks, threads included);
* ``/tmp``: a tmpfs of ``TMP_SHARE`` of the memory limit. Writing past it fails with ENOSPC;
  its pages count against the memory limit, so /tmp and RAM together stay within it.

* the container's writable layer (``/``, ``/root``, ``/workspace``...), at
  ``Settings.sandbox_disk_mb``: by the engine where its storage can (``--storage-opt size=``,
  overlay2 on xfs with project quotas), else by the host's watch, which evicts a sandbox past it
  (``docker/layer_bound.py``; on ext4, as here, the engine refuses the option). Each file there
  also stops at that size (``RLIMIT_FSIZE``, inherited by every exec: a write or ``fallocate``
  past it fails with EFBIG), so a single preallocation cannot take the disk before the watch sees
  it;
* the writable layer's inodes, at ``Settings.sandbox_inodes``: by the host's watch (no engine
  bounds them; the size option is a block quota).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

DEFAULT_CPUS = 1
DEFAULT_MEMORY_MB = 2048
PIDS_LIMIT = 1024
TMP_SHARE = 0.5
TMP_PATH = "/tmp"


def cpus_or_default(cpus: float | None) -> float:
    """The task's CPUs, or Harbor's documented default."""
    return DEFAULT_CPUS if cpus is None else cpus


def memory_mb_or_default(memory_mb: int | None) -> int:
    """The task's memory in MB, or Harbor's documented default."""
    return DEFAULT_MEMORY_MB if memory_mb is None else memory_mb


class SandboxBounds(BaseModel):
    """The limits one sandbox container is created with (one decision, carried as data)."""

    model_config = ConfigDict(frozen=True)

    cpus: float
    memory_mb: int
    pids_limit: int = PIDS_LIMIT
    tmp_mb: int
    disk_mb: int = 0  # the writable layer outside /tmp (0: unbounded)
    inodes: int = 0  # the writable layer's inodes (0: unbounded)

    @classmethod
    def resolve(
        cls, cpus: float | None, memory_gb: float | None, *, disk_mb: int = 0, inodes: int = 0
    ) -> SandboxBounds:
        """Bounds for a create call's ``cpus`` / ``memory_gb`` (None: the defaults)."""
        memory_mb = memory_mb_or_default(int(memory_gb * 1024) if memory_gb else None)
        if memory_mb < 16:
            raise ValueError(f"memory_gb={memory_gb} is below the 16 MiB a sandbox needs to start")
        tmp_mb = max(1, int(memory_mb * TMP_SHARE))
        return cls(cpus=cpus_or_default(cpus), memory_mb=memory_mb, tmp_mb=tmp_mb, disk_mb=disk_mb, inodes=inodes)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * 1024 * 1024

    @property
    def disk_bytes(self) -> int:
        return self.disk_mb * 1024 * 1024

    @property
    def file_size_limit(self) -> int | None:
        """``RLIMIT_FSIZE`` for every process of the sandbox: no file may outgrow the disk bound,
        whose watch only sees a file once it is allocated (None: no disk bound)."""
        return self.disk_bytes or None
