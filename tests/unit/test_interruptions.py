"""An interruption (a ``BaseException`` that is not an ``Exception``: a cancellation, an exit, a
test's timeout, which is pytest's ``Failed``) is raised on, never made a result.

``serve_locally`` raises an interruption of the backend's shutdown again once its server has
stopped: uvicorn only logs what the app's lifespan raises and ends normally, so a shutdown cut
short looked like one that had finished, and the test around it passed. An ``Exception`` of the
shutdown stays uvicorn's to log, as before. A prewarm whose group was interrupted raises the
interruption rather than reporting the group failed."""

from __future__ import annotations

import asyncio

import pytest

from osmosis_harbor.errors import PrewarmError
from osmosis_harbor.prewarm.warmer import Warmer, _Prepared
from osmosis_harbor.serving.local import serve_locally


class Interruption(BaseException):
    """What an interruption looks like to the backend: not an ``Exception`` (pytest's
    ``Failed``, ``KeyboardInterrupt`` and ``SystemExit`` are not either)."""


class ShutdownRaises:
    """The parts of a backend the rollout server calls while nothing is posted."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.shut_down = False

    def health(self) -> dict:
        return {"status": "ok"}

    def has_capacity(self) -> bool:
        return True

    def rollout_status(self, rollout_id: str) -> None:
        return None

    def cancel_rollouts(self, ids=None, prefix=None, all=False) -> dict:
        return {}

    async def execute(self, request):
        raise AssertionError("no rollout is posted")

    async def shutdown(self) -> None:
        self.shut_down = True
        raise self.error


@pytest.mark.parametrize(
    "error", [Interruption("timed out"), asyncio.CancelledError()], ids=["interruption", "cancelled"]
)
async def test_an_interrupted_shutdown_is_raised_once_the_server_has_stopped(error: BaseException) -> None:
    backend = ShutdownRaises(error)
    with pytest.raises(type(error)) as raised:
        async with serve_locally(backend) as url:
            assert url.startswith("http://127.0.0.1:")
    assert backend.shut_down and raised.value is error


async def test_a_failed_shutdown_stays_the_servers_to_log() -> None:
    backend = ShutdownRaises(RuntimeError("could not remove a sandbox"))
    async with serve_locally(backend):
        pass
    assert backend.shut_down


def _prewarmer(tmp_path, group_error: BaseException) -> Warmer:
    """A prewarm of one task whose one group's warm-up raises ``group_error`` (no backend)."""
    prewarmer = object.__new__(Warmer)
    prewarmer._work = tmp_path / "work"
    prewarmer._work.mkdir()

    async def prepare(task_id: str) -> _Prepared:
        return _Prepared(
            task_id=task_id, path=tmp_path, source=tmp_path, environment_id="e", cpus=None, memory_mb=None,
            no_network=False, group_key="g",
        )  # fmt: skip

    async def warm_group(key: str, items: list[_Prepared]):
        raise group_error

    prewarmer._prepare = prepare  # type: ignore[method-assign]
    prewarmer._warm_group = warm_group  # type: ignore[method-assign]
    return prewarmer


async def test_an_interrupted_prewarm_group_interrupts_the_prewarm(tmp_path) -> None:
    error = Interruption("timed out")
    with pytest.raises(Interruption) as raised:
        await _prewarmer(tmp_path, error).run(["task"])
    assert raised.value is error


async def test_a_failed_prewarm_group_is_reported(tmp_path) -> None:
    with pytest.raises(PrewarmError, match="failed for every task.*RuntimeError: no image"):
        await _prewarmer(tmp_path, RuntimeError("no image")).run(["task"])
