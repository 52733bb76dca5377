"""The ``exclusive`` marker under pytest-xdist: a test so marked runs while no other test runs.

Why: the suite runs on several xdist workers that share one machine and one Docker engine. A
few tests measure or check something machine-wide (a process's peak memory, every mount
under a directory, the engine's image tags, a benchmark's figures); run next to another
worker's test, they would see its work as theirs. Every other check is scoped to the worker's
own resources (its ledger, its emulator server, its processes' pids).

How: a readers-writer lock on a file shared by the workers of one run (``fcntl.flock``). Every
test holds it shared for its whole setup, call and teardown; an ``exclusive`` test holds it
exclusively. A turnstile lock keeps a waiting exclusive test from being starved: a test takes
the turnstile before taking the shared lock and lets it go at once, so once an exclusive test
holds the turnstile, no new test starts until it has run. Without xdist (one process) nothing
is locked.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.support.xdist_run import is_worker, run_directory

MARKER = "exclusive"


class _RunLock:
    """The two lock files of one xdist run, opened by one worker."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._turnstile: IO[bytes] = open(directory / "exclusive-turnstile.lock", "ab")  # noqa: SIM115
        self._rw: IO[bytes] = open(directory / "exclusive-rw.lock", "ab")  # noqa: SIM115

    def hold(self, exclusive: bool) -> _Held:
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._rw, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        return _Held(self._rw)

    def close(self) -> None:
        self._turnstile.close()
        self._rw.close()


class _Held:
    def __init__(self, rw: IO[bytes]) -> None:
        self._rw = rw

    def release(self) -> None:
        fcntl.flock(self._rw, fcntl.LOCK_UN)


class ExclusivePlugin:
    """Registered on xdist workers only (see ``tests/conftest.py``)."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._lock: _RunLock | None = None

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        if self._lock is None:
            self._lock = _RunLock(run_directory(self._config))
        held = self._lock.hold(exclusive=item.get_closest_marker(MARKER) is not None)
        try:
            yield
        finally:
            held.release()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._lock is not None:
            self._lock.close()


def lock_is_free(path: Path, mode: int) -> bool:
    """Whether the lock file ``path`` could be locked in ``mode`` right now (taken and let go at
    once): how the lock's tests look at who holds it."""
    with path.open("ab") as probe:
        try:
            fcntl.flock(probe, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(probe, fcntl.LOCK_UN)
        return True


def register(config: pytest.Config) -> None:
    if is_worker(config):
        config.pluginmanager.register(ExclusivePlugin(config), "osmosis-harbor-exclusive")


def pytest_configure(config: pytest.Config) -> None:
    """When loaded on its own (``-p tests.support.exclusive``), as its test's sessions do; the suite's
    conftest calls :func:`register` itself."""
    register(config)
