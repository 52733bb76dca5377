"""A test that outlives its timeout fails, with every thread's stack and every task's
(``tests/support/timeouts.py``), in pytest sessions of their own (pytester, a subprocess each: a real
SIGALRM, a real process exit). Blocked where it is plainly seen, inside a product call that
cleans up and re-raises, in a task whose exceptions are kept as results, inside a served
backend's shutdown, after a failure, and blocked again after swallowing the timeout; on one
process and on an xdist worker. Each swallowing case has its positive control: the same
session without the plugin passes (or blocks for all its time), run beside it (both mostly wait)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.common import REPO

pytest_plugins = ["pytester"]

# Each session waits out its timeout (and some the grace after it): as short as still shows where
# the alarm found the test on a loaded machine.
TIMEOUT_SEC = 2
GRACE_SEC = 4  # a failed test's teardown on a loaded machine (closing its event loop) fits in it
# room for a server's start-up on a loaded machine (about 1.5 s at a load of 12 on two cores) before
# the blocked shutdown
SERVED_TIMEOUT_SEC = 7
TEARDOWN_BLOCK_SEC = TIMEOUT_SEC + GRACE_SEC + 1  # over both: only a timeout in the teardown ends it sooner

INI = f"""
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
timeout = {TIMEOUT_SEC}
timeout_grace_sec = {GRACE_SEC}
"""

LOCK_HELD_ELSEWHERE = """
import threading, time

def hold(lock, release):
    with lock:
        release.wait(60)

def test_waits_for_a_lock_another_thread_holds():
    lock, release = threading.Lock(), threading.Event()
    threading.Thread(target=hold, args=(lock, release), name="the-holder", daemon=True).start()
    time.sleep(0.2)
    try:
        lock.acquire()
    finally:
        release.set()
"""

# write_file cleans up its temporary file on any exception and re-raises it (except BaseException)
PRODUCT_CALL = """
import os, time
from osmosis_harbor.tasks import files

async def test_blocked_inside_a_product_call(tmp_path, monkeypatch):
    def stuck_replace(src, dst):
        time.sleep(60)

    monkeypatch.setattr(files.os, "replace", stuck_replace)
    try:
        files.write_file(tmp_path / "out.txt", "data")
    finally:
        print("LEFT:", sorted(p.name for p in tmp_path.iterdir()))
"""

# The shape of the hang the suite met: a backend's shutdown blocked behind the served result.
SERVED_SHUTDOWN = """
import time

import osmosis_ai.rollout.server  # imported while collecting: the test's time is its own
import pytest

import osmosis_harbor.serving.server
from osmosis_harbor.serving.local import serve_locally

class BlockedShutdownBackend:
    def health(self):
        return {"status": "ok"}

    def has_capacity(self):
        return True

    def rollout_status(self, rollout_id):
        return None

    def cancel_rollouts(self, ids=None, prefix=None, all=False):
        return {}

    async def execute(self, request):
        raise AssertionError("no rollout is posted")

    async def shutdown(self):
        time.sleep(60)  # a blocking wait on the event loop's thread

@pytest.mark.timeout(SERVED_TIMEOUT_SEC)  # a server's start-up on a loaded machine
async def test_a_backend_whose_shutdown_blocks():
    async with serve_locally(BlockedShutdownBackend()) as url:
        assert url.startswith("http://127.0.0.1:")
""".replace("SERVED_TIMEOUT_SEC", str(SERVED_TIMEOUT_SEC))

# The timeout's exception as a task's result, as any gather(return_exceptions=True) keeps it.
GATHERED = """
import asyncio, time

async def blocked():
    time.sleep(60)  # a blocking wait on the event loop's thread

async def test_a_task_whose_exceptions_are_results():
    await asyncio.gather(blocked(), return_exceptions=True)
"""

SWALLOWED_THEN_BLOCKED = """
import time

def test_swallows_its_timeout_and_blocks_again():
    try:
        time.sleep(60)
    except BaseException:
        time.sleep(60)
"""

FAILED_THEN_TEARDOWN_BLOCKED = """
import time
import pytest

@pytest.fixture
def stuck_teardown():
    yield
    time.sleep(TEARDOWN_BLOCK_SEC)

def test_fails_and_blocks_in_its_teardown(stuck_teardown):
    assert 1 == 2
""".replace("TEARDOWN_BLOCK_SEC", str(TEARDOWN_BLOCK_SEC))


@pytest.fixture
def session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Started]]:
    """Starts ``source`` as a pytest session of its own, in a directory of its own: with this
    suite's timeout plugin (``tests.support.timeouts``, importable from the checkout) unless
    ``plugin=False``. A session mostly waits out a timeout, so a test starts its session and the
    positive control's together and then reads each one's result."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started: list[Started] = []

    def start(source: str, *args: str, plugin: bool = True) -> Started:
        where = pytester.mkdir(f"session-{len(started)}")
        (where / "pytest.ini").write_text(INI)
        (where / "test_blocked.py").write_text(source)
        options = [
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--durations=0",
            "--durations-min=0",
            *(["-p", "tests.support.timeouts"] if plugin else []),
        ]
        command = [sys.executable, "-m", "pytest", f"--basetemp={where / 'tmp'}", *options, *args]
        with (where / "stdout").open("w") as out, (where / "stderr").open("w") as err:
            run = Started(where, pytester.popen(command, stdout=out, stderr=err, cwd=where), time.monotonic())
        started.append(run)
        return run

    yield start
    for run in started:  # a test that failed before reading a result leaves no session running
        run.stop()


class Started:
    """A running session: ``result()`` waits for it (at most three minutes)."""

    def __init__(self, where: Path, process: subprocess.Popen[bytes], began: float) -> None:
        self.where, self.process, self.began = where, process, began

    def result(self) -> pytest.RunResult:
        try:
            code = self.process.wait(timeout=180)
        finally:
            self.stop()
        took = time.monotonic() - self.began
        out, err = ((self.where / name).read_text().splitlines() for name in ("stdout", "stderr"))
        return pytest.RunResult(code, out, err, took)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _text(result: pytest.RunResult) -> str:
    return "\n".join(result.outlines + result.errlines)


def _phase_sec(result: pytest.RunResult, phase: str) -> float:
    """How long the session's test took in ``phase`` (``--durations``: the session's own
    start-up and collection left out)."""
    found = re.search(rf"^([0-9.]+)s {phase} ", "\n".join(result.outlines), re.M)
    return float(found.group(1)) if found else 0.0


def test_a_blocked_test_fails_at_its_timeout_with_every_threads_stack(session) -> None:
    result = session(LOCK_HELD_ELSEWHERE).result()
    result.assert_outcomes(failed=1)
    text = _text(result)
    assert f"Timeout (>{TIMEOUT_SEC}s)" in text
    assert "~~~~ thread the-holder" in text and "in hold" in text  # the thread that holds the lock
    assert "(where the timeout found it)" in text and "lock.acquire()" in text  # the waiter
    assert _phase_sec(result, "call") < TIMEOUT_SEC + GRACE_SEC, "it failed at its timeout, not at the last resort"


def test_a_block_inside_a_product_call_that_cleans_up_fails_with_the_stacks(session) -> None:
    """``write_file`` removes its temporary file on any exception and raises it again: the
    timeout's exception ends the test, the clean-up ran, the stacks and every task are shown."""
    result = session(PRODUCT_CALL).result()
    result.assert_outcomes(failed=1)
    text = _text(result)
    assert f"Timeout (>{TIMEOUT_SEC}s)" in text
    assert "osmosis_harbor/tasks/files.py" in text and "stuck_replace" in text
    assert "~~~~ asyncio task" in text and "test_blocked_inside_a_product_call" in text
    assert "LEFT: []" in text  # the temporary file went with the exception


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["one-process", "xdist-worker"])
def test_a_swallowed_timeout_still_fails(session, workers: list[str]) -> None:
    run, control_run = session(GATHERED, *workers), session(GATHERED, *workers, plugin=False)
    result = run.result()
    result.assert_outcomes(failed=1)
    text = _text(result)
    assert "something caught the timeout's exception and went on" in text
    assert "in blocked" in text and "time.sleep(60)" in text  # where the alarm found the loop's thread
    assert _phase_sec(result, "call") < TIMEOUT_SEC + GRACE_SEC, "not at the last resort"

    # positive control: pytest-timeout alone raises the same exception there, the gather keeps
    # it as a result, and the test passes once its time is up
    control = control_run.result()
    control.assert_outcomes(passed=1)
    assert _phase_sec(control, "call") >= TIMEOUT_SEC - 1  # the timer ran through its setup too


def test_a_timeout_in_a_served_backends_shutdown_fails_with_the_stacks(session) -> None:
    """uvicorn logs what the app's lifespan raises and ends normally; ``serve_locally`` raises
    an interruption of the backend's shutdown again once the server has stopped: the timeout
    fails the test with pytest-timeout alone too."""
    run, control = session(SERVED_SHUTDOWN), session(SERVED_SHUTDOWN, plugin=False)
    result = run.result()
    result.assert_outcomes(failed=1)
    text = _text(result)
    assert f"Timeout (>{SERVED_TIMEOUT_SEC}s)" in text
    assert "in shutdown" in text and "time.sleep(60)" in text and "osmosis_harbor/serving/local.py" in text
    assert _phase_sec(result, "call") < SERVED_TIMEOUT_SEC + GRACE_SEC, "not at the last resort"
    control.result().assert_outcomes(failed=1)


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["one-process", "xdist-worker"])
def test_a_test_still_blocked_after_its_grace_ends_its_process_with_the_stacks(session, workers: list[str]) -> None:
    result = session(SWALLOWED_THEN_BLOCKED, *workers).result()
    assert result.ret != 0
    text = _text(result)
    assert "still running" in text and "its timeout was caught and swallowed" in text
    assert "Stacks now:" in text and "test_swallows_its_timeout_and_blocks_again" in text
    if workers:
        assert "crashed" in text  # xdist's report of the worker that ended
    assert result.duration < 60, "ended after its grace, not after the minute it would have blocked"


def test_a_failed_test_is_still_timed_through_its_teardown(session) -> None:
    """pytest-timeout stops its timer when a phase fails (for pdb): a teardown that blocks would
    hang the run. Positive control: without the plugin the teardown blocks for all its time."""
    run, control_run = session(FAILED_THEN_TEARDOWN_BLOCKED), session(FAILED_THEN_TEARDOWN_BLOCKED, plugin=False)
    result = run.result()
    result.assert_outcomes(failed=1, errors=1)
    assert f"Timeout (>{TIMEOUT_SEC}s)" in _text(result) and "in stuck_teardown" in _text(result)
    control = control_run.result()
    control.assert_outcomes(failed=1)
    assert _phase_sec(result, "teardown") < TEARDOWN_BLOCK_SEC <= _phase_sec(control, "teardown")
