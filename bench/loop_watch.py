"""A watch on the event loop a long benchmark runs on: its longest stall, and where it stalled.

Why: a long-poll the server answers late (a client's ``ReadTimeout``) is either a loop that
stopped turning or a request no one read. A thread that sees the loop's heartbeat go stale
records the loop thread's stack while it is stuck (the code that holds the loop), and samples
the process's open file descriptors (a server out of them accepts no connection, and a client's
request then waits in the listen backlog until it times out).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["LoopWatch", "watching"]

BEAT_SEC = 0.1
STALL_SEC = 2.0


@dataclass
class LoopWatch:
    max_lag_sec: float = 0.0
    stalls: int = 0  # heartbeats late by more than STALL_SEC
    worst_stack: str = ""
    max_open_fds: int = 0
    _beat: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, object]:
        return {
            "loop max lag (s)": round(self.max_lag_sec, 2),
            f"loop stalls over {STALL_SEC:g} s": self.stalls,
            "max open fds": self.max_open_fds,
        }


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _watch(watch: LoopWatch, loop_thread: int, stop: threading.Event) -> None:
    stalled_since: float | None = None
    while not stop.wait(0.25):
        watch.max_open_fds = max(watch.max_open_fds, _open_fds())
        late = time.monotonic() - watch._beat
        if late <= STALL_SEC:
            stalled_since = None
            continue
        if stalled_since is None:
            stalled_since = watch._beat
            watch.stalls += 1
        if late > watch.max_lag_sec:
            watch.max_lag_sec = late
            frame = sys._current_frames().get(loop_thread)
            if frame is not None:
                watch.worst_stack = "".join(traceback.format_stack(frame)[-12:])


@contextlib.asynccontextmanager
async def watching() -> AsyncIterator[LoopWatch]:
    watch = LoopWatch()
    stop = threading.Event()
    thread = threading.Thread(target=_watch, args=(watch, threading.get_ident(), stop), daemon=True)

    async def beat() -> None:
        while True:
            now = time.monotonic()
            watch.max_lag_sec = max(watch.max_lag_sec, now - watch._beat - BEAT_SEC)
            watch._beat = now
            await asyncio.sleep(BEAT_SEC)

    beating = asyncio.create_task(beat())
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        await asyncio.to_thread(thread.join)
