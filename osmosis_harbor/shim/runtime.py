"""Machinery shared by both phases: deadlines, the event loop, the phase driver.

``run_phase`` is what makes the entry points safe to call from generated
console scripts: it parses options, runs the phase's coroutine, turns *any*
failure into ``<phase>/error.json`` plus a non-zero exit code, and prints one
scrubbed summary line to stderr (Harbor keeps the command's output in the
trial directory, so that line is the first thing a human reads).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import math
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from . import SHIM_VERSION
from .contract import environ
from .errors import DeadlineExceeded, InputError, Redactor, error_file
from .files import remove_stale, write_model
from .models import Phase
from .paths import ShimPaths

EXIT_OK = 0
EXIT_FAILED = 1
_SUMMARY_MESSAGE_LIMIT = 300


def read_timeout(name: str, env: Mapping[str, str] | None = None) -> float | None:
    """A deadline from the environment; unset or empty means unbounded.

    NaN and infinities are refused like ``ExecutionRequest`` refuses them
    (NaN crashes the selector, inf silently disables enforcement); zero and
    negative values are kept and mean "already expired", as in LocalBackend.
    """
    raw = (environ(env).get(name) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise InputError(f"{name}={raw!r} is not a number") from exc
    if not math.isfinite(value):
        raise InputError(f"{name} must be finite; leave it unset to run unbounded")
    return value


async def run_with_deadline[T](factory: Callable[[], Awaitable[T]], *, budget: float | None, what: str) -> T:
    """Await ``factory()`` under *budget* seconds, with LocalBackend's semantics.

    A failure after the deadline fired keeps its exception (and so its
    category) but takes the deadline's message. A call that *returns* after
    the budget -- because it swallowed the cancellation or blocked the event
    loop in synchronous code -- is still a timeout: success after the host
    stopped waiting would be a lie.
    """
    message = f"{what} exceeded its {budget}s deadline"
    started = time.monotonic()
    deadline = asyncio.timeout(budget)
    try:
        async with deadline:
            result = await factory()
    except Exception as exc:
        if deadline.expired():
            raise DeadlineExceeded(message, exc) from exc
        raise
    if budget is not None and (deadline.expired() or time.monotonic() - started > budget):
        raise TimeoutError(message)
    return result


def run_coroutine[T](coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, also when the caller already runs an event loop.

    Console scripts never do, but a host-side harness or an async test might;
    then the phase gets a private loop in a worker thread instead of failing
    with "asyncio.run() cannot be called from a running event loop".
    """
    try:
        asyncio.get_running_loop()
        loop_running = True
    except RuntimeError:
        loop_running = False
    # Outside the except block, so user tracebacks carry no "no running event
    # loop" context.
    if not loop_running:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass(frozen=True)
class PhaseOptions:
    """Command-line overrides; every one of them defaults to the environment."""

    logs_dir: str | None = None
    rollout_input: str | None = None
    grading_input: str | None = None


class _Parser(argparse.ArgumentParser):
    """Reports bad options as ``InputError`` so they land in the error file.

    A wrong command line is a bug in the host's generated entry point; an
    exit without ``error.json`` would leave nothing to diagnose it by.
    """

    def error(self, message: str) -> NoReturn:
        raise InputError(f"invalid command line: {message}")


def parse_options(phase: Phase, argv: Sequence[str] | None) -> PhaseOptions:
    """Parse ``argv`` (``None`` means ``sys.argv[1:]``).

    ``--help`` raises ``SystemExit(0)``; bad options raise ``InputError``.
    """
    parser = _Parser(
        prog=f"osmosis-harbor-shim {phase}",
        description=f"Run the Osmosis {phase} phase inside a Harbor sandbox.",
    )
    parser.add_argument("--logs-dir", help="overrides $OSMOSIS_LOGS_DIR (default /logs)")
    if phase == "agent":
        parser.add_argument("--rollout-input", help="overrides $OSMOSIS_ROLLOUT_INPUT")
    else:
        parser.add_argument("--grading-input", help="overrides $OSMOSIS_GRADING_INPUT")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    return PhaseOptions(
        logs_dir=args.logs_dir,
        rollout_input=getattr(args, "rollout_input", None),
        grading_input=getattr(args, "grading_input", None),
    )


def log_line(redactor: Redactor, text: str) -> None:
    """One scrubbed line on stderr; never raises (stderr may be closed)."""
    try:
        print(redactor.text(text), file=sys.stderr, flush=True)
    except Exception:
        pass


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _SUMMARY_MESSAGE_LIMIT:
        text = text[: _SUMMARY_MESSAGE_LIMIT - 3] + "..."
    return text


PhaseBody = Callable[[ShimPaths, Redactor], Coroutine[Any, Any, str]]


def run_phase(
    phase: Phase,
    body: PhaseBody,
    *,
    argv: Sequence[str] | None,
    outputs: Callable[[ShimPaths], Sequence[Path]],
    error_path: Callable[[ShimPaths], Path],
) -> int:
    """Run one phase and convert every outcome into files plus an exit code.

    *body* does the work and writes the success files, returning the summary
    text; *outputs* lists the files a previous run may have left behind.
    The verdict is recorded *inside* the event loop, as soon as the body
    ends: tearing the loop down waits for worker threads (a workflow's
    ``asyncio.to_thread`` call still blocked after a timeout, say), and the
    host must not have to wait for those to learn the outcome. Never raises:
    even ``SystemExit``/``KeyboardInterrupt`` from user code become an error
    file, because a raised exception would leave the host with no
    explanation at all.
    """
    recorder = _Recorder(phase, error_path)
    try:
        recorder.redactor = Redactor.from_env()
        try:
            options = parse_options(phase, argv)
        except SystemExit:  # --help: argparse printed the usage
            return EXIT_OK
        paths = ShimPaths.from_env(
            logs_dir=options.logs_dir,
            rollout_input=options.rollout_input,
            grading_input=options.grading_input,
        )
        recorder.paths = paths
        remove_stale(*outputs(paths))

        async def guarded() -> int:
            try:
                summary = await body(paths, recorder.redactor)
            except BaseException as exc:  # noqa: BLE001 -- includes CancelledError
                return recorder.failure(exc)
            return recorder.success(summary)

        return run_coroutine(guarded())
    except BaseException as exc:  # noqa: BLE001 -- the contract is "never raise"
        if recorder.exit_code is not None:  # verdict already on disk
            return recorder.exit_code
        return recorder.failure(exc)


class _Recorder:
    """Writes a phase's verdict exactly once and remembers the exit code."""

    def __init__(self, phase: Phase, error_path: Callable[[ShimPaths], Path]) -> None:
        self.phase = phase
        self.error_path = error_path
        self.redactor = Redactor()
        self.paths: ShimPaths | None = None
        self.exit_code: int | None = None
        self.started = time.monotonic()
        self.prefix = f"osmosis-harbor-shim[{phase}] v{SHIM_VERSION}"

    def _elapsed(self) -> str:
        return f"elapsed={time.monotonic() - self.started:.2f}s"

    def success(self, summary: str) -> int:
        self.exit_code = EXIT_OK
        log_line(self.redactor, f"{self.prefix} ok {summary} {self._elapsed()}")
        return EXIT_OK

    def failure(self, exc: BaseException) -> int:
        self.exit_code = EXIT_FAILED
        try:
            record = error_file(self.phase, exc, self.redactor)
            paths = self.paths or ShimPaths.from_env()
            write_model(self.error_path(paths), record, self.redactor)
            detail = (
                f"category={record.category.value} type={record.type} {self._elapsed()}: {_one_line(record.message)}"
            )
        except BaseException as write_exc:  # noqa: BLE001
            detail = f"type={type(exc).__name__} (error file not written: {write_exc!r})"
        log_line(self.redactor, f"{self.prefix} FAILED {detail}")
        return EXIT_FAILED


__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "log_line",
    "read_timeout",
    "run_coroutine",
    "run_phase",
    "run_with_deadline",
]
