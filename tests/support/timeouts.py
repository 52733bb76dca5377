"""A test that outlives its timeout fails, with the stack of every thread and every asyncio task.

Why not pytest-timeout's own handler alone: its ``signal`` method raises ``Failed`` from SIGALRM
wherever the main thread is. Under an event loop that is often inside a task's step, and then
the exception is that task's result: whoever swallows the task's exceptions swallows the
timeout. uvicorn does so for the app's lifespan (a shutdown that raises is logged, and the server
ends normally): a test blocked in its backend's shutdown ran 600.02 s, exactly the timeout, and
was reported PASSED, the rest of the shutdown never run. Its ``thread`` method cannot be
swallowed (it ends the process), but under xdist its stacks go to a worker's terminal and every
test after it in that worker loses its module fixtures.

How, through the hooks pytest-timeout offers other timeout strategies, with its settings
(``timeout``, ``timeout_func_only``, a ``timeout`` mark):

1. at the timeout (SIGALRM, on the main thread) the stacks of every thread (the main thread's
   where the alarm found it) and of every unfinished task of the running event loop are kept on
   the test, and ``Failed`` carrying them is raised there, as pytest-timeout raises its own;
2. the first report of that test that is not already a failure becomes one, with those stacks
   (``pytest_runtest_makereport``), whatever became of the exception;
3. if the test still runs ``timeout_grace_sec`` later (the exception swallowed and the thread
   blocked again, or stuck where no Python code runs), the stacks go to the process's stderr
   and the process exits, as the ``thread`` method does: xdist reports the test as failed and
   starts a new worker. ``faulthandler_timeout`` (pyproject.toml) dumps the stacks at the C
   level later still, for a thread that never lets go of the GIL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import traceback
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest

NAME = "osmosis-harbor-timeouts"
GRACE_INI = "timeout_grace_sec"
DEFAULT_GRACE_SEC = 30.0
_STACKS = pytest.StashKey[str]()  # the stacks taken when the test's time ran out
_SETTLED = pytest.StashKey[bool]()  # a report of the test has failed since
_TIMER = pytest.StashKey["_Timer"]()


def _frame_lines(frame: FrameType) -> str:
    return "".join(traceback.format_stack(frame))


def _coroutine_frames(coro: Any) -> list[FrameType]:
    """A task's coroutine and the ones it awaits, outermost first: where each one waits."""
    frames = []
    while coro is not None and len(frames) < 100:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return frames


def stacks(alarmed: FrameType | None = None) -> str:
    """Every thread's stack (this one's at ``alarmed``, where a signal found it), then every
    unfinished task of the event loop running in this thread, each where it waits."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    here = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == here and alarmed is not None:
            frame, note = alarmed, " (where the timeout found it)"
        else:
            note = " (this one)" if ident == here else ""
        parts.append(f"~~~~ thread {names.get(ident, '<unknown>')} ({ident}){note}\n{_frame_lines(frame)}")
    loop = asyncio._get_running_loop()
    if loop is not None:
        for task in sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name()):
            where = "".join(
                f'  File "{f.f_code.co_filename}", line {f.f_lineno}, in {f.f_code.co_name}\n'
                for f in _coroutine_frames(task.get_coro())
            )
            parts.append(f"~~~~ asyncio task {task.get_name()}\n{where}")
    return "".join(parts)


class _Timer:
    """One test's timeout: the alarm, then the last resort."""

    def __init__(self, item: pytest.Item, timeout: float, grace: float, debugger_detection: bool) -> None:
        self.item = item
        self.timeout = timeout
        self.debugger_detection = debugger_detection
        self.watchdog = threading.Timer(timeout + grace, self.last_resort)
        self.watchdog.name = f"{NAME} {item.nodeid}"
        self.watchdog.daemon = True

    def start(self) -> None:
        signal.signal(signal.SIGALRM, self.alarm)
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        self.watchdog.start()

    def cancel(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        self.watchdog.cancel()

    def _debugging(self) -> bool:
        import pytest_timeout

        return self.debugger_detection and pytest_timeout.is_debugging()

    def alarm(self, signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        if self._debugging():
            return
        found = stacks(frame)
        self.item.stash[_STACKS] = found
        pytest.fail(f"Timeout (>{self.timeout:g}s): every thread's stack and every task's\n{found}")

    def last_resort(self) -> None:
        """The test outlived its timeout and the grace after it: say where everything is, and end
        the process (no Python-level exception got it out)."""
        if self._debugging():
            return
        capman = self.item.config.pluginmanager.getplugin("capturemanager")
        try:
            if capman is not None:
                capman.suspend_global_capture(in_=True)
            first = self.item.stash.get(_STACKS, None)
            text = (
                f"\n{'+' * 30} Timeout {'+' * 30}\n{self.item.nodeid}: still running "
                f"{self.watchdog.interval - self.timeout:g}s after its timeout of {self.timeout:g}s"
                + ("" if first is None else "; its timeout was caught and swallowed. Stacks at the timeout:\n" + first)
                + f"\nStacks now:\n{stacks()}{'+' * 69}\n"
            )
            sys.stderr.write(text)
            sys.stderr.flush()
        finally:
            os._exit(1)


class FailingTimeouts:
    """pytest-timeout's timer, replaced for its ``signal`` method (see the module docstring)."""

    def __init__(self) -> None:
        self._interacting = False

    @pytest.hookimpl(wrapper=True)
    def pytest_exception_interact(self, node: pytest.Item | pytest.Collector) -> Generator[None, None, None]:
        """pytest-timeout stops the timer here (for pdb), but pytest calls this hook for every
        phase that raised, pdb or not: a test whose call failed would tear down untimed, and a
        teardown that hangs would hang the run. The timer stops only for pdb."""
        self._interacting = True
        try:
            return (yield)
        finally:
            self._interacting = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
            return None  # pytest-timeout's own (its thread method ends the process, stacks and all)
        grace = float(item.config.getini(GRACE_INI) or DEFAULT_GRACE_SEC)
        timer = _Timer(item, settings.timeout, grace, not settings.disable_debugger_detection)
        item.stash[_TIMER] = timer
        timer.start()
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        timer = item.stash.get(_TIMER, None)
        if timer is None:
            return None
        if self._interacting and not item.config.getoption("usepdb", False):
            return True  # a failed phase, not pdb: the rest of the test stays timed
        del item.stash[_TIMER]
        timer.cancel()
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        found = item.stash.get(_STACKS, None)
        if found is None or item.stash.get(_SETTLED, False):
            return report
        if report.failed:
            item.stash[_SETTLED] = True
        elif report.passed:
            item.stash[_SETTLED] = True
            report.outcome = "failed"
            report.longrepr = (
                f"Timeout: the test's time ran out during {report.when}, and something caught the timeout's "
                f"exception and went on (it passed, it must not). Every thread's stack and every task's, "
                f"at the timeout:\n{found}"
            )
        return report


def add_options(parser: pytest.Parser) -> None:
    parser.addini(
        GRACE_INI,
        "seconds a test may run on after its timeout (its exception swallowed) before the process "
        f"dumps every stack and exits (default {DEFAULT_GRACE_SEC:g})",
    )


def register(config: pytest.Config) -> None:
    """On every process that runs tests, wherever pytest-timeout is loaded."""
    manager = config.pluginmanager
    if manager.has_plugin("timeout") and not manager.has_plugin(NAME):
        manager.register(FailingTimeouts(), NAME)


def pytest_addoption(parser: pytest.Parser) -> None:
    """When loaded on its own (``-p tests.support.timeouts``), as its tests' sessions do; the suite's
    conftest calls :func:`add_options` and :func:`register` itself."""
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    register(config)
