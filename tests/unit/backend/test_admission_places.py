"""Admission's queue places through osmosis_ai's real rollout server (in process, over ASGI):
a burst never overshoots ``max_queue_depth``, a refused duplicate gives its place back, and an
admitted rollout still on its way to ``execute()`` keeps its place after its admission ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from osmosis_ai.rollout.server.app import create_rollout_server
from osmosis_ai.rollout.types import ExecutionOutcome, ExecutionRequest

from osmosis_harbor.backend.reservations import Reservation, Reservations
from osmosis_harbor.sandbox.owner.context import admission_place

WAIT_SEC = 10.0  # a bound on waits that end at once when the code is right


class PlacesBackend:
    """The admission half of our backends: ``has_capacity()`` and ``execute()`` over the real
    ``Reservations``; each rollout stays queued in execute() until the server cancels it."""

    def __init__(self, depth: int, *, reserving: bool = True, reservations: Reservations | None = None) -> None:
        self.depth = depth
        self.reserving = reserving
        self.executing = 0  # rollouts in execute(): what the queue holds
        self.peak = 0
        self.reservations = reservations or Reservations(depth, lambda: self.executing)
        self.answers: list[bool] = []
        self.asked = asyncio.Event()  # has_capacity() was asked since the test cleared it
        self.claimed: dict[str, Reservation | None] = {}
        self.reached = asyncio.Condition()

    def has_capacity(self) -> bool:
        if self.reserving:
            yes = self.reservations.grant() is not None
        else:  # the protection switched off: a yes holds nothing until execute() starts
            yes = self.reservations.queued() < self.depth
        self.answers.append(yes)
        self.asked.set()
        return yes

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        self.claimed[request.id] = self.reservations.claim()
        self.executing += 1
        self.peak = max(self.peak, self.executing)
        async with self.reached:
            self.reached.notify_all()
        try:
            await asyncio.get_running_loop().create_future()  # queued until the test cancels it
        finally:
            self.executing -= 1
        raise AssertionError("unreachable")

    async def until_executing(self, count: int) -> None:
        async with self.reached:
            await asyncio.wait_for(self.reached.wait_for(lambda: self.executing >= count), WAIT_SEC)

    def health(self) -> dict[str, Any]:
        return {}

    def rollout_status(self, rollout_id: str) -> None:
        return None

    def cancel_rollouts(self, ids: Any = None, prefix: Any = None, all: bool = False) -> dict[str, str]:
        return {}  # the server then cancels the rollout's task itself

    async def shutdown(self) -> None:
        return None


@asynccontextmanager
async def server_for(backend: PlacesBackend) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """The real osmosis app with its lifespan; every rollout is cancelled before it closes."""
    app = create_rollout_server(backend=backend, configure_logging=False)  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rollout-server") as http:
            try:
                yield http, app.state.rollout_futures
            finally:
                await http.post("/rollout/cancel", json={"all": True})


def post(http: httpx.AsyncClient, rollout_id: str) -> asyncio.Task[httpx.Response]:
    """One POST /rollout in a task of its own, as the web server runs each request."""
    body = {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": "go"}],
        "chat_completions_url": "http://127.0.0.1:9/v1",
        "llm_api_key": "sk-unit",
    }
    return asyncio.create_task(http.post("/rollout", json=body))


def holding_lock_after_the_next_admission(
    backend: PlacesBackend, registry: Any
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Stands for a result poll or a cancel holding the server's registry lock just as the next
    admission is under way, so that its runner waits before execute(); held until ``free`` is set.
    (The holder starts in the test's task: its context carries no admission's place.)"""
    free = asyncio.Event()
    backend.asked.clear()

    async def hold() -> None:
        await backend.asked.wait()
        async with registry.lock:
            await free.wait()

    return free, asyncio.create_task(hold())


@pytest.mark.parametrize("reserving", [True, False], ids=["places-held", "positive-control-no-places"])
async def test_a_burst_of_posts_never_overshoots_the_queue_depth(reserving: bool) -> None:
    """Eight POSTs at once against a depth of three: the server admits them one after another,
    each before the rollouts admitted earlier reach execute(); only held places keep count."""
    backend = PlacesBackend(3, reserving=reserving)
    async with server_for(backend) as (http, _):
        codes = [r.status_code for r in await asyncio.gather(*(post(http, f"r{i}") for i in range(8)))]
        await backend.until_executing(codes.count(202))
        if reserving:
            assert codes.count(202) == 3 and codes.count(429) == 5, codes
            assert backend.peak == 3 and backend.reservations.held() == 0
            assert all(isinstance(place, Reservation) for place in backend.claimed.values())
        else:  # without places the burst overshoots: the protection is what holds the bound
            assert codes.count(202) > 3 and backend.peak > 3, codes


async def test_a_refused_duplicate_gives_its_place_back_at_once() -> None:
    backend = PlacesBackend(2)
    async with server_for(backend) as (http, _):
        assert (await post(http, "dup")).status_code == 202
        await backend.until_executing(1)
        for _ in range(3):  # each is granted the one place left, then refused: a kept place would 429 the next
            assert (await post(http, "dup")).status_code == 409
            assert backend.answers[-1] is True
        assert (await post(http, "fresh")).status_code == 202  # the one place is still free
        await backend.until_executing(2)
        assert (await post(http, "one-too-many")).status_code == 429


class Forgetful(Reservations):
    """The positive control: a place goes with its admission, whatever it left on its way."""

    def _admission_ended(self, place: Reservation) -> None:
        self._held.pop(place, None)


@pytest.mark.parametrize("forgetful", [False, True], ids=["heirs-keep-it", "positive-control-forgetful"])
async def test_an_admitted_rollout_on_its_way_keeps_its_place_after_its_admission_ended(forgetful: bool) -> None:
    """The server's runner reaches execute() only after its registry lock, which a result poll
    or a cancel may hold meanwhile (here ``hold``): the admission has long answered 202 by then."""
    backend = PlacesBackend(1)
    if forgetful:
        backend.reservations = Forgetful(1, lambda: backend.executing)
    async with server_for(backend) as (http, registry):
        free, holder = holding_lock_after_the_next_admission(backend, registry)
        first = post(http, "first")
        assert (await first).status_code == 202 and registry.lock.locked()
        assert backend.executing == 0  # its runner is still on its way to execute()
        backend.asked.clear()
        second = post(http, "second")  # asked after the first admission's task ended
        await asyncio.wait_for(backend.asked.wait(), WAIT_SEC)
        free.set()
        await holder
        codes = [(await first).status_code, (await second).status_code]
        if forgetful:  # the place went with the admission: depth 1, two rollouts queued
            await backend.until_executing(2)
            assert codes == [202, 202] and backend.peak == 2
        else:
            await backend.until_executing(1)
            assert codes == [202, 429] and backend.peak == 1
            assert isinstance(backend.claimed["first"], Reservation)  # the first claimed its own place
            assert backend.reservations.held() == 0


async def test_a_rollout_that_ends_before_execute_gives_its_place_back() -> None:
    """An admitted rollout cancelled on its way (its runner waits on the registry lock): its place
    is held no longer than the tasks its admission left, which end with the rollout's result."""
    backend = PlacesBackend(1)
    granted: list[Reservation | None] = []
    grant = backend.reservations.grant
    backend.reservations.grant = lambda: granted.append(grant()) or granted[-1]  # type: ignore[method-assign]
    async with server_for(backend) as (http, registry):
        free, holder = holding_lock_after_the_next_admission(backend, registry)
        assert (await post(http, "cancelled")).status_code == 202
        assert (await post(http, "refused")).status_code == 429  # the first admission has ended...
        place = granted[0]
        assert place is not None and place.heirs and backend.executing == 0  # ...its runner on its way
        registry.entries["cancelled"].task.cancel()
        free.set()
        await holder
        await asyncio.wait_for(asyncio.wait(list(place.heirs)), WAIT_SEC)  # the server settles it
        assert backend.reservations.held() == 0 and backend.executing == 0
        assert (await post(http, "next")).status_code == 202


async def test_a_place_travels_only_into_the_tasks_its_admission_started() -> None:
    """Without the server: a refused admission's place goes as it ends, an admitted one's stays
    for the task it started, a direct execute() (no admission) claims nothing."""
    reservations = Reservations(1, lambda: 0)
    go = asyncio.Event()
    claims: list[Reservation | None] = []

    async def runner() -> None:  # the server's task for the rollout, started by the admission
        await go.wait()
        claims.append(reservations.claim())

    async def admission(refuse: bool) -> tuple[Reservation | None, asyncio.Task[None] | None]:
        place = reservations.grant()
        if place is None or refuse:
            return place, None
        assert admission_place() is place
        return place, asyncio.create_task(runner())

    refused, none = await asyncio.create_task(admission(True))
    assert refused is not None and none is None
    place, started = await asyncio.create_task(admission(False))  # the refused one's place is free again
    assert place is not None and started is not None
    assert (await asyncio.create_task(admission(False))) == (None, None)  # kept after its admission ended
    assert reservations.claim() is None  # this task was not started by an admission
    go.set()
    await started
    assert claims == [place] and reservations.held() == 0
