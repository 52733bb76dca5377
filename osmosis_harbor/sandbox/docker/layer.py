"""How much disk one container's writable layer holds, read from the host: bytes and inodes.

The engine's own figure (``SizeRw``, ``docker ps -s``) walks the layer inside dockerd and reports
apparent sizes; a file of holes counts in full and a fallocated one, which fills the disk at
once, counts the same as written. So the layer is measured here as the filesystem allocates it:
the blocks of every entry under the container's overlay ``UpperDir`` (hardlinks once), plus the
blocks of files its processes deleted but still hold open, which no walk sees and which stay on
the disk until closed. Files on other filesystems (the tmpfs ``/tmp``, ``/dev/shm``) are memory,
bounded elsewhere.

Needs the engine's storage on this machine, readable by this process (root with a local
engine); `LayerProbe.open` returns None where it is not (a remote engine, another driver).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import docker.errors
from docker import APIClient

__all__ = ["LayerProbe", "LayerUsage"]

log = logging.getLogger(__name__)

DELETED = " (deleted)"


@dataclass(frozen=True)
class LayerUsage:
    """What a writable layer holds on the host's filesystem; as a bound, 0 means unbounded."""

    bytes: int = 0
    inodes: int = 0

    def over(self, bound: LayerUsage) -> bool:
        return bool(bound.bytes and self.bytes > bound.bytes or bound.inodes and self.inodes > bound.inodes)


@dataclass(frozen=True)
class LayerProbe:
    """Where one container's writable layer and processes are, found once from its inspect."""

    container_id: str
    upper: Path  # the overlay UpperDir: what the container wrote
    root_dev: int  # st_dev of files opened through the container's root (its overlay mount)
    procs: Path  # the cgroup file listing the container's processes

    @classmethod
    def open(cls, api: APIClient, container_id: str) -> LayerProbe | None:
        """The probe of a running container, or None when its layer cannot be read from here."""
        try:
            data = api.inspect_container(container_id)
        except docker.errors.NotFound:
            return None
        upper = ((data.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
        pid = int((data.get("State") or {}).get("Pid") or 0)
        if not upper or pid <= 0:
            return None
        try:
            procs = _procs_file(Path(f"/proc/{pid}/cgroup").read_text())
            root_dev = os.stat(f"/proc/{pid}/root").st_dev
            os.stat(upper)
        except (OSError, ValueError) as exc:
            log.debug("layer of %s not readable here: %s", container_id[:12], exc)
            return None
        return cls(container_id=container_id, upper=Path(upper), root_dev=root_dev, procs=procs)

    def usage(self, bound: LayerUsage) -> LayerUsage | None:
        """What the layer holds now (the walk stops early, with a partial figure, once it is over
        ``bound``); None once the container is gone."""
        if not self.upper.exists():
            return None
        seen: set[int] = set()
        walked = _tree_usage(self.upper, seen, bound)
        if walked.over(bound):
            return walked
        held = self._held(seen)
        return LayerUsage(walked.bytes + held.bytes, walked.inodes + held.inodes)

    def _held(self, seen: set[int]) -> LayerUsage:
        """Blocks and inodes of deleted files the container's processes still hold open."""
        try:
            pids = self.procs.read_text().split()
        except OSError:
            return LayerUsage()
        total = inodes = 0
        for pid in pids:
            try:
                fds = list(os.scandir(f"/proc/{pid}/fd"))
            except OSError:
                continue
            for fd in fds:
                try:
                    if not os.readlink(fd.path).endswith(DELETED):
                        continue
                    st = os.stat(fd.path)
                except OSError:
                    continue
                if st.st_dev == self.root_dev and stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
                    inodes += 1
        return LayerUsage(total, inodes)


def _tree_usage(top: Path, seen: set[int], bound: LayerUsage) -> LayerUsage:
    """Allocated bytes and inodes under ``top`` (no link followed, each hardlinked inode once),
    stopping once past ``bound``."""
    total = inodes = 0
    max_bytes, max_inodes = bound.bytes or -1, bound.inodes or -1
    stack = [str(top)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:  # removed while we walk
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif st.st_nlink > 1:
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += st.st_blocks * 512
                inodes += 1
                if inodes == max_inodes + 1 or total > max_bytes > 0:  # over: the rest changes nothing
                    return LayerUsage(total, inodes)
    return LayerUsage(total, inodes)


def _procs_file(cgroup: str) -> Path:
    """The ``cgroup.procs`` of a process's cgroup, from its ``/proc/<pid>/cgroup``: the pids
    controller's on cgroup v1, the unified hierarchy's on v2."""
    lines = [line.split(":", 2) for line in cgroup.splitlines() if line.count(":") >= 2]
    for _, controllers, path in lines:
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids") / path.lstrip("/") / "cgroup.procs"
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" and controllers == "":
            return Path("/sys/fs/cgroup") / path.lstrip("/") / "cgroup.procs"
    raise ValueError(f"no pids or unified cgroup in {cgroup!r}")
