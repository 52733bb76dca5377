"""Per-pool locks shared by threads of this process and by other processes on this machine."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["pool_lock"]


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextmanager
def pool_lock(lock_dir: Path, key: str) -> Iterator[None]:
    """Exclusive per-pool lock for threads of this process and for other processes.

    ``lock_dir``: ``Settings.pool_lock_dir()``, in the user cache dir (machine-local, like the
    engine the locks guard), carried by the engine's config.

    ``flock`` alone would serialise threads too (each acquisition opens its own file
    description), but the thread lock keeps same-process waiters off the kernel lock and
    makes the intent explicit.
    """
    with _thread_locks_guard:
        tlock = _thread_locks.setdefault(key, threading.Lock())
    with tlock:
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
