"""A shutdown that delivers what it finished: the drain between SIGTERM and the socket closing.

osmosis_ai 0.3.8's server stops in its ASGI lifespan, and uvicorn runs the lifespan's
shutdown only after it has closed the listening socket: rollouts that finish or are cancelled
there are never seen by the controller, which learns results only by long-polling
``GET /rollout/{id}/result``. The drain runs before that, while the server still answers:

1. admission closes: ``POST /rollout`` answers 503 with ``Retry-After`` (the seconds left in
   the drain) and ``GET /health`` says ``draining``;
2. in-flight rollouts get ``grace_sec`` to finish; those still running then end as cancelled,
   with a message saying the shutdown cancelled them, and their execution is cancelled (the
   backend terminates their sandboxes);
3. result polls are answered until every terminal result was delivered once, or until
   ``grace_sec + delivery_sec`` after the drain began.

Only then may the server close its socket (``osmosis_harbor.serving.server.serve`` does that).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from osmosis_ai.rollout.server.result_registry import (
    RolloutFuture,
    RolloutFutureRegistry,
    UnknownRolloutError,
)
from osmosis_ai.rollout.types import (
    RolloutErrorCategory,
    RolloutResultResponse,
    RolloutStatus,
)
from starlette.middleware import Middleware
from starlette.responses import JSONResponse

log = logging.getLogger("uvicorn.error")  # the drain is part of the server's stop sequence

DEFAULT_GRACE_SEC = 30.0
DEFAULT_DELIVERY_SEC = 10.0
TERMINAL = frozenset({RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED})
_RESULT_PATH = re.compile(r"/rollout/[^/]+/result")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class DrainPolicy:
    """How long a stopping server waits for rollouts to finish, then for their results to be read.

    ``grace_sec``: in-flight rollouts may finish within it; the rest are cancelled at its end.
    ``delivery_sec``: after the grace period, how long results may still wait for their poll.
    The socket closes at most ``grace_sec + delivery_sec`` after the drain began (earlier once
    every result was delivered); size the orchestrator's kill timeout (Kubernetes'
    ``terminationGracePeriodSeconds``) above that plus sandbox cleanup.
    """

    grace_sec: float = DEFAULT_GRACE_SEC
    delivery_sec: float = DEFAULT_DELIVERY_SEC

    def __post_init__(self) -> None:
        for name, value in (("shutdown_grace_sec", self.grace_sec), ("delivery_sec", self.delivery_sec)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class DrainReport:
    """What a drain did, for the log line and for callers that drain programmatically."""

    cancelled: list[str]  # rollouts the shutdown cancelled at the end of the grace period
    undelivered: list[str]  # terminal results nobody polled before the deadline
    seconds: float


class Drain:
    """The drain of one server app: admission, in-flight rollouts and result delivery."""

    def __init__(self, registry: RolloutFutureRegistry, policy: DrainPolicy) -> None:
        self.registry = registry
        self.policy = policy
        self.started_at: float | None = None
        self._run: asyncio.Future[DrainReport] | None = None
        self._delivered: set[str] = set()
        self._admissions = 0  # POST /rollout requests past the gate and not yet answered
        self._changed = asyncio.Event()  # a delivery or an admission ended

    # ── state read by the middleware and /health ──────────────────────────────
    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def seconds_left(self) -> float:
        if self.started_at is None:
            return self.policy.grace_sec + self.policy.delivery_sec
        deadline = self.started_at + self.policy.grace_sec + self.policy.delivery_sec
        return max(0.0, deadline - time.monotonic())

    def retry_after(self) -> int:
        """Whole seconds until this server is gone: a retry here is pointless before then."""
        return max(1, math.ceil(self.seconds_left()))

    def health(self) -> dict[str, Any]:
        assert self.started_at is not None
        elapsed = time.monotonic() - self.started_at
        in_flight = len(self._in_flight())
        return {
            "phase": "grace" if in_flight and elapsed < self.policy.grace_sec else "delivery",
            "grace_sec": self.policy.grace_sec,
            "delivery_sec": self.policy.delivery_sec,
            "elapsed_sec": round(elapsed, 3),
            "in_flight": in_flight,
            "undelivered": len(self._owed()),
        }

    @contextlib.asynccontextmanager
    async def admission(self) -> AsyncIterator[None]:
        """Count a POST /rollout the gate let through until it is answered, so that a drain
        starting meanwhile still sees the rollout it registers."""
        self._admissions += 1
        try:
            yield
        finally:
            self._admissions -= 1
            self._changed.set()

    def record_delivery(self, rollout_id: str) -> None:
        """A terminal result was sent to a poller (called once its last byte was written)."""
        self._delivered.add(rollout_id)
        if len(self._delivered) > 2 * len(self.registry.entries) + 1024:
            self._delivered &= self.registry.entries.keys()  # forget results past retention
        self._changed.set()

    # ── the drain itself ──────────────────────────────────────────────────────
    def begin(self) -> None:
        """Close admission now (``run`` does the rest); idempotent."""
        if self.started_at is None:
            self.started_at = time.monotonic()

    async def run(self) -> DrainReport:
        """Close admission, give in-flight rollouts the grace period, cancel the rest, then
        wait (bounded) for every terminal result to be delivered. Later calls await the first."""
        if self._run is None:
            self._run = asyncio.ensure_future(self._drain())
        return await asyncio.shield(self._run)

    async def _drain(self) -> DrainReport:
        self.begin()
        assert self.started_at is not None
        grace_end = self.started_at + self.policy.grace_sec
        deadline = grace_end + self.policy.delivery_sec
        log.info(
            "Draining: admission closed, %d rollout(s) in flight, %g s grace period",
            len(self._in_flight()),
            self.policy.grace_sec,
        )
        await self._wait(lambda: self._admissions == 0 and not self._in_flight(), until=grace_end)
        cancelled = await self._cancel_in_flight()
        await self._wait(lambda: self._admissions == 0 and not self._owed(), until=deadline)
        undelivered = sorted(self._owed())
        report = DrainReport(
            cancelled=cancelled, undelivered=undelivered, seconds=round(time.monotonic() - self.started_at, 3)
        )
        log.info(
            "Drained in %.1f s: %d rollout(s) cancelled at the end of the grace period, %d result(s) never polled%s",
            report.seconds,
            len(cancelled),
            len(undelivered),
            f" ({', '.join(undelivered[:10])})" if undelivered else "",
        )
        return report

    def _entries(self) -> list[RolloutFuture]:
        return list(self.registry.entries.values())

    def _in_flight(self) -> list[RolloutFuture]:
        return [entry for entry in self._entries() if not entry.result.done()]

    def _owed(self) -> list[str]:
        """Terminal results not yet delivered, except those whose controller is known gone."""
        owed = []
        for entry in self._entries():
            if not entry.result.done() or entry.result.cancelled() or entry.rollout_id in self._delivered:
                continue
            if entry.result.result().err_category is RolloutErrorCategory.LEASE_EXPIRED:
                continue  # its controller stopped polling: nobody will collect it
            owed.append(entry.rollout_id)
        return owed

    async def _wait(self, done: Callable[[], bool], *, until: float) -> None:
        """Wait, without polling, until ``done()`` or the monotonic time ``until``."""
        while not done():
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            results: list[asyncio.Future[Any]] = [entry.result for entry in self._in_flight()]
            try:
                await asyncio.wait([changed, *results], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()

    async def _cancel_in_flight(self) -> list[str]:
        """End every rollout still running as cancelled-by-shutdown, then cancel its execution.

        The result is published first, so the controller's pending poll returns it at once
        and a late completion cannot overwrite it; the execution's cancellation (sandbox
        termination) proceeds while results are being delivered."""
        reason = (
            f"cancelled by server shutdown: still running when the {self.policy.grace_sec:g} s "
            "shutdown grace period ended"
        )
        cancelled = []
        for entry in self._in_flight():
            response = RolloutResultResponse(
                rollout_id=entry.rollout_id, status=RolloutStatus.CANCELLED, err_message=reason
            )
            try:
                published = await self.registry.complete(entry.rollout_id, response)
            except UnknownRolloutError:  # its admission failed meanwhile: nothing to deliver
                continue
            if published:
                self.registry.cancel_execution(entry)
                cancelled.append(entry.rollout_id)
        if cancelled:
            log.info("Grace period over: cancelled %d rollout(s): %s", len(cancelled), ", ".join(cancelled[:10]))
        return cancelled


class DrainMiddleware:
    """The drain's view of HTTP: refuse admissions while draining, and notice deliveries."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["method"] == "POST" and scope["path"] == "/rollout":
            if self.drain.draining:
                await self._refuse(scope, receive, send)
                return
            async with self.drain.admission():
                await self.app(scope, receive, send)
        elif scope["method"] == "GET" and _RESULT_PATH.fullmatch(scope["path"]):
            await self.app(scope, receive, self._observing(send))
        else:
            await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            {
                "detail": "rollout server is draining for shutdown: submit to another server, or "
                "retry after Retry-After seconds"
            },
            status_code=503,
            headers={"Retry-After": str(self.drain.retry_after())},
        )
        await response(scope, receive, send)

    def _observing(self, send: Send) -> Send:
        """``send`` that records a terminal result once its last byte has been handed over."""
        status = 0
        body = bytearray()

        async def observe(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status == 200:
                body.extend(message.get("body", b""))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body") and status == 200:
                rollout_id = _terminal_rollout_id(bytes(body))
                if rollout_id is not None:
                    self.drain.record_delivery(rollout_id)

        return observe


def _terminal_rollout_id(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
        status = RolloutStatus(payload["status"])
    except (ValueError, KeyError, TypeError):
        return None
    return payload.get("rollout_id") if status in TERMINAL else None


def install_drain(app: FastAPI, policy: DrainPolicy) -> Drain:
    """Attach a drain to an app made by ``create_rollout_server`` (before it starts serving).

    Installing twice returns the first drain."""
    existing = getattr(app.state, "drain", None)
    if isinstance(existing, Drain):
        return existing
    registry = getattr(app.state, "rollout_futures", None)
    if not isinstance(registry, RolloutFutureRegistry):
        raise TypeError(
            "the app has no app.state.rollout_futures: pass the app made by "
            "osmosis_ai.rollout.server.create_rollout_server"
        )
    if app.middleware_stack is not None:
        raise RuntimeError("the app is already serving: install the drain before it starts")
    drain = Drain(registry, policy)
    # Appended, so it sits inside osmosis' own middleware (its API-key check runs first).
    app.user_middleware.append(Middleware(DrainMiddleware, drain=drain))
    _report_drain_in_health(app, drain)
    app.state.drain = drain
    return drain


def _report_drain_in_health(app: FastAPI, drain: Drain) -> None:
    """Make ``GET /health`` say ``draining`` (and how far along) while the drain runs."""
    route = next(
        (
            r
            for r in app.router.routes
            if isinstance(r, APIRoute) and r.path == "/health" and "GET" in (r.methods or ())
        ),
        None,
    )
    if route is None:
        return
    original = route.endpoint
    app.router.routes.remove(route)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        payload = dict(await original())
        if drain.draining:
            payload["status"] = "draining"
            payload["drain"] = drain.health()
            lifecycle = payload.get("lifecycle")
            if isinstance(lifecycle, dict):
                payload["lifecycle"] = {**lifecycle, "accepting_rollouts": False}
        return payload


__all__ = [
    "DEFAULT_DELIVERY_SEC",
    "DEFAULT_GRACE_SEC",
    "Drain",
    "DrainMiddleware",
    "DrainPolicy",
    "DrainReport",
    "install_drain",
]
