"""The ``exclusive`` marker's lock (``tests/support/exclusive.py``): an exclusive holder shuts out every
other test, shared holders run side by side, and a waiting exclusive test is not starved by
tests that keep arriving. Each ``_RunLock`` opens the files anew, so two of them contend as two
xdist workers do (``flock`` locks belong to the open file, not the process). Then a real xdist
run of two workers: the plugin holds the lock shared around an ordinary test and exclusively
around a marked one."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.common import REPO, wait_until
from tests.support.exclusive import _RunLock
from tests.support.exclusive import lock_is_free as _free


def test_shared_holders_coexist_and_an_exclusive_one_waits_for_them_without_starving(tmp_path: Path) -> None:
    rw, turnstile = tmp_path / "exclusive-rw.lock", tmp_path / "exclusive-turnstile.lock"
    reader, writer = _RunLock(tmp_path), _RunLock(tmp_path)
    first = reader.hold(exclusive=False)
    assert _free(rw, fcntl.LOCK_SH) and not _free(rw, fcntl.LOCK_EX)  # shared: others share, none excludes

    got = threading.Event()

    def write() -> None:
        writer.hold(exclusive=True)
        got.set()

    thread = threading.Thread(target=write)
    thread.start()
    # the writer waits for the reader, holding the turnstile: a test arriving now cannot start
    wait_until(lambda: not _free(turnstile, fcntl.LOCK_EX), timeout=30, what="the writer to take the turnstile")
    assert not got.is_set()
    first.release()
    thread.join(timeout=30)
    assert got.is_set()
    assert _free(turnstile, fcntl.LOCK_EX), "the writer let the turnstile go once it held the lock"
    assert not _free(rw, fcntl.LOCK_SH), "an exclusive holder shuts out shared ones"
    reader.close()
    writer.close()


SESSION = """
import fcntl
from pathlib import Path

import pytest

from tests.support.exclusive import lock_is_free

RW = Path({rw!r})


def _free(mode):
    return lock_is_free(RW, mode)


def test_an_ordinary_test_holds_it_shared():
    assert _free(fcntl.LOCK_SH) and not _free(fcntl.LOCK_EX)


@pytest.mark.exclusive
def test_a_marked_test_holds_it_alone():
    assert not _free(fcntl.LOCK_SH)
"""


@pytest.mark.slow
def test_the_plugin_holds_the_lock_around_each_test_on_xdist_workers(tmp_path: Path) -> None:
    base = tmp_path / "base"
    test_file = tmp_path / "test_modes.py"
    test_file.write_text(SESSION.format(rw=str(base / "exclusive-rw.lock")))
    (tmp_path / "none.ini").write_text("[pytest]\nmarkers =\n    exclusive: alone\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.exclusive", "-c", str(tmp_path / "none.ini")]
        + ["--rootdir", str(tmp_path), "-p", "no:cacheprovider", "--basetemp", str(base), "-n", "2", str(test_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout, proc.stdout[-3000:]
