"""Prewarm behind a server that already answers: ``/health`` shows it, rollouts wait for it.

A harness waits a fixed time for ``/health`` (osmosis-ai's ``osmosis eval run``: 90 s) and takes a
server that has not answered by then for a dead one, while a first image build can take longer.
So ``prewarm_lifespan(background=True)`` serves at once: ``/health`` says ``starting`` with the
prewarm's progress and ``ready: false``, ``POST /rollout`` answers 429 (the osmosis client retries
after ``Retry-After``), and the server is ready once prewarm is done. A failed prewarm prints why
and stops the server through the stop hook the serving layer put on the app (``STOP_HOOK``;
``serving.server.serve`` then exits 1). Stopping the server during prewarm cancels it, which
removes its work folder and its sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from osmosis_harbor.prewarm.report import PrewarmReport
from osmosis_harbor.prewarm.warmer import ProgressCallback

__all__ = ["STOP_HOOK", "Startup", "StartupPhase"]

# ``app.state.<STOP_HOOK>(reason)``: how a server run by ``serving`` is asked to stop, failing.
STOP_HOOK = "osmosis_harbor_stop"
_FINISHED_STAGES = frozenset({"done", "failed"})


class StartupPhase(StrEnum):
    PREWARMING = "prewarming"
    READY = "ready"
    FAILED = "failed"


class Startup:
    """One prewarm run while the server serves: its progress, and the task running it."""

    def __init__(self, tasks: int) -> None:
        self.phase = StartupPhase.PREWARMING
        self.tasks = tasks
        self.stages: dict[str, str] = {}  # environment group -> its current stage
        self.error: str | None = None
        self._started = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.phase is StartupPhase.READY

    def progress(self, group: str, stage: str) -> None:
        self.stages[group] = stage

    def state(self) -> dict[str, Any]:
        """What ``/health`` shows under ``startup``."""
        return {
            "phase": self.phase.value,
            "elapsed_sec": round(time.monotonic() - self._started, 1),
            "tasks": self.tasks,
            "groups": len(self.stages),
            "groups_finished": sum(stage in _FINISHED_STAGES for stage in self.stages.values()),
            "stages": dict(self.stages),
            "error": self.error,
        }

    def start(self, prewarm: Callable[[ProgressCallback], Awaitable[PrewarmReport]], app: Any) -> None:
        self._task = asyncio.create_task(self._run(prewarm, app), name="osmosis-harbor-prewarm")

    async def stop(self) -> None:
        """Cancel a prewarm still running (its own cleanup runs) and wait for it."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, prewarm: Callable[[ProgressCallback], Awaitable[PrewarmReport]], app: Any) -> None:
        _say(f"prewarming {self.tasks} task(s) while serving; rollouts are refused (429) until it is done")
        try:
            report = await prewarm(self.progress)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.phase, self.error = StartupPhase.FAILED, f"{type(exc).__name__}: {exc}"
            _say(f"prewarm failed, stopping the server: {self.error}")
            stop = getattr(getattr(app, "state", None), STOP_HOOK, None)
            if callable(stop):
                stop(self.error)
            return
        self.phase = StartupPhase.READY
        _say(
            f"prewarm done in {report.wall_sec:.1f} s ({report.groups} environment(s): {report.built} built, "
            f"{report.reused} reused, {report.failed} task(s) failed); ready for rollouts"
        )


def _say(message: str) -> None:
    """A line for the server's log (a harness keeps the server's output in its run log)."""
    print(f"osmosis-harbor: {message}", file=sys.stderr, flush=True)
