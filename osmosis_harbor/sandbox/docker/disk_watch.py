"""The host's watch over local sandboxes' writable layers, where the engine cannot bound them.

overlay2 enforces ``--storage-opt size=`` only on xfs with project quotas; on other backing
filesystems (ext4, as here) a sandbox's writes outside ``/tmp`` would share the host's disk
unbounded. And no engine bounds a layer's inodes (the size option sets a block quota only), so a
sandbox's empty files would exhaust the filesystem's inodes with its disk bound untouched. So each
sandbox this process starts or claims is measured from the host (``layer.LayerProbe``: bytes and
inodes in one walk) and evicted once past ``Settings.sandbox_disk_mb`` or
``Settings.sandbox_inodes``, as kubelet evicts a pod past its ephemeral-storage limit
(``evictions``).

What it costs: one ``statvfs`` of the engine's filesystem per tick (about a microsecond), and a
walk of a layer (about 16 ms for a layer holding a pip-installed bundle, 6,000 files; 0.3 ms for
a baked bundle's; it stops as soon as it is past a bound) at once when the whole filesystem's
used bytes or inodes grew by more than that layer's headroom since it was last walked
(``fallocate`` allocates gigabytes in milliseconds), and otherwise as often as its headroom
requires at ``ASSUMED_WRITE_RATE`` and ``ASSUMED_CREATE_RATE`` (the growth another user's
deletions could hide from that trigger), but never more than ``WATCH_CPU_SHARE`` of a core on
walks in all. One that lives less than ``FIRST_LOOK_SEC`` and stays within its bounds is never
walked.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from docker import APIClient

from osmosis_harbor.sandbox.docker.layer import LayerProbe, LayerUsage

__all__ = ["DiskWatch", "WatchStats"]

log = logging.getLogger(__name__)

TICK_SEC = 0.1
ASSUMED_WRITE_RATE = 1024**3  # bytes per second; this machine's disk takes 0.45 GB/s, its page cache 1.2
ASSUMED_CREATE_RATE = 200_000  # inodes per second; `touch` in one sandbox made 2,000-4,500 a second here
FIRST_LOOK_SEC = 1.0
MIN_INTERVAL_SEC = 0.5
MAX_INTERVAL_SEC = 30.0  # the longest a layer waits for the schedule's walk, within the CPU share
WATCH_CPU_SHARE = 0.05  # of one core: the walks' budget, which spaces them out with many sandboxes

Evict = Callable[[str, LayerUsage, LayerUsage], None]  # (container id, used, bound)


@dataclass
class _Watched:
    bound: LayerUsage
    due: float
    probe: LayerProbe | None = None
    used: LayerUsage = LayerUsage()
    fs_used_at: LayerUsage | None = None  # the filesystem's use when this layer was last measured


@dataclass
class WatchStats:
    """What the watch has cost so far (for the figures in docs/ and the tests)."""

    walks: int = 0
    walk_sec: float = 0.0
    evictions: int = 0
    largest_layer: int = 0
    most_inodes: int = 0


class DiskWatch:
    """One thread per engine, started with the first sandbox it watches."""

    def __init__(self, api: APIClient, evict: Evict, *, filesystem: Path) -> None:
        self._api = api
        self._evict = evict
        self._watched: dict[str, _Watched] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._filesystem = filesystem  # where the engine keeps the layers, for statvfs
        self._walk_sec = 0.0  # a moving average of one walk's cost
        self.stats = WatchStats()

    def watch(self, container_id: str, bound: LayerUsage) -> None:
        """Bound ``container_id``'s writable layer at ``bound`` (bytes and inodes; 0: not that one)."""
        if bound.bytes <= 0 and bound.inodes <= 0:
            return
        baseline = self._filesystem_used()  # from here, growth past the bound has the layer walked
        with self._cond:
            self._watched[container_id] = _Watched(
                bound=bound, due=time.monotonic() + FIRST_LOOK_SEC, fs_used_at=baseline
            )
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="osmosis-docker-disk-watch", daemon=True)
                self._thread.start()
            self._cond.notify()

    def forget(self, container_id: str) -> None:
        with self._cond:
            self._watched.pop(container_id, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                self._cond.wait(TICK_SEC)
            try:
                self._tick()
            except Exception:  # never let one bad pass end the watch
                log.exception("disk watch pass failed")

    def _tick(self) -> None:
        now = time.monotonic()
        fs_used = self._filesystem_used()
        with self._cond:
            due = [(cid, w) for cid, w in self._watched.items() if w.due <= now or _may_be_full(w, fs_used)]
        for container_id, watched in due:
            self._measure(container_id, watched, fs_used)

    def _measure(self, container_id: str, watched: _Watched, fs_used: LayerUsage | None) -> None:
        if watched.probe is None and not self._open(container_id, watched):
            return
        assert watched.probe is not None
        started = time.perf_counter()
        used = watched.probe.usage(watched.bound)
        took = time.perf_counter() - started
        self.stats.walks += 1
        self.stats.walk_sec += took
        self._walk_sec = took if self.stats.walks == 1 else 0.9 * self._walk_sec + 0.1 * took
        if used is None:  # removed: nothing left to bound
            self.forget(container_id)
            return
        self.stats.largest_layer = max(self.stats.largest_layer, used.bytes)
        self.stats.most_inodes = max(self.stats.most_inodes, used.inodes)
        if used.over(watched.bound):
            self.forget(container_id)
            self.stats.evictions += 1
            self._evict(container_id, used, watched.bound)
            return
        watched.used, watched.fs_used_at = used, fs_used
        headroom = _headroom_sec(watched)
        budget = self._walk_sec * len(self._watched) / WATCH_CPU_SHARE
        watched.due = time.monotonic() + max(MIN_INTERVAL_SEC, headroom, budget)

    def _open(self, container_id: str, watched: _Watched) -> bool:
        probe = LayerProbe.open(self._api, container_id)
        if probe is None:  # gone (or going): nothing to bound
            self.forget(container_id)
            return False
        watched.probe = probe
        return True

    def _filesystem_used(self) -> LayerUsage | None:
        try:
            fs = os.statvfs(self._filesystem)
        except OSError:
            return None
        return LayerUsage((fs.f_blocks - fs.f_bfree) * fs.f_frsize, fs.f_files - fs.f_ffree)


def _headroom_sec(watched: _Watched) -> float:
    """How long this layer takes to pass a bound at the assumed rates."""
    bound, used = watched.bound, watched.used
    times = [MAX_INTERVAL_SEC]
    if bound.bytes:
        times.append((bound.bytes - used.bytes) / ASSUMED_WRITE_RATE)
    if bound.inodes:
        times.append((bound.inodes - used.inodes) / ASSUMED_CREATE_RATE)
    return min(times)


def _may_be_full(watched: _Watched, fs_used: LayerUsage | None) -> bool:
    """The filesystem's used bytes or inodes grew by more than this layer's headroom since it was
    measured: it could be the one that grew (fast allocations outrun the schedule)."""
    if fs_used is None or watched.fs_used_at is None:
        return False
    bound, used, then = watched.bound, watched.used, watched.fs_used_at
    return bool(
        bound.bytes
        and fs_used.bytes - then.bytes >= bound.bytes - used.bytes
        or bound.inodes
        and fs_used.inodes - then.inodes >= bound.inodes - used.inodes
    )
