"""The server's realism: per-call latency and injected faults, as an ASGI middleware.

Every fault is something the *server* does on the wire, so the client meets exactly what an
HTTP session against SkyPilot's API server would meet: a 503 or a 429 with ``Retry-After``, a
connection reset (a TCP RST, the socket closed with ``SO_LINGER`` 0, no response at all), the
same reset after the call ran (its answer lost on the way back: "reset-after"), a
call that hangs past the client's timeout, or a sandbox evicted under the call. Faults are
drawn per call from a generator seeded by ``Knobs.seed`` (a run's pattern repeats), or queued
deterministically with `FaultRule` for tests. ``/admin`` and ``/healthz`` are never faulted
nor delayed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import struct
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from osmosis_harbor.sandbox.emulator.wire import FaultRule, Knobs

__all__ = ["FaultInjector", "FaultMiddleware"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]
Evictor = Callable[[str | None], Awaitable[str | None]]

EXEMPT_PREFIXES = ("/admin", "/healthz")


class FaultInjector:
    """Which fault, if any, the next call gets; and the counts of what was injected."""

    def __init__(self, knobs: Knobs) -> None:
        self.knobs = knobs
        self._rng = random.Random(knobs.seed)
        self._queue: list[FaultRule] = []
        self.calls = 0
        self.injected: Counter[str] = Counter()
        # Calls by route ("PUT /sandboxes/{name}/files"): which SDK calls a client made, so a
        # test or bench can tell Harbor's transfer path (writes, reads, execs) from the rest.
        self.by_route: Counter[str] = Counter()
        # Faults by the sandbox whose route they hit: which rollouts met one (a soak checks
        # that every loss our code reports is explained by a fault the server really injected).
        self.by_sandbox: dict[str, Counter[str]] = {}
        # The sandbox of an exec id (``GET /execs/{id}`` names none); set by the app.
        self.exec_sandbox: Callable[[str], str | None] = lambda _: None

    def set_knobs(self, knobs: Knobs) -> None:
        """New knobs restart the seeded sequence, so a test gets the same pattern each run."""
        self.knobs = knobs
        self._rng = random.Random(knobs.seed)

    def queue(self, rule: FaultRule) -> None:
        self._queue.append(rule)

    def clear(self) -> None:
        self._queue.clear()
        self.injected.clear()
        self.by_route.clear()
        self.by_sandbox.clear()
        self.calls = 0

    def count(self, fault: str, path: str) -> None:
        self.injected[fault] += 1
        sandbox = _sandbox_in(path) or self._exec_sandbox_in(path)
        if sandbox is not None:
            self.by_sandbox.setdefault(sandbox, Counter())[fault] += 1

    def _exec_sandbox_in(self, path: str) -> str | None:
        parts = path.strip("/").split("/")
        return self.exec_sandbox(parts[1]) if len(parts) == 2 and parts[0] == "execs" else None

    def draw(self, method: str, path: str) -> str | None:
        self.calls += 1
        self.by_route[f"{method} {route_of(path)}"] += 1
        for rule in self._queue:
            if path.startswith(rule.path) and (rule.method is None or rule.method.upper() == method):
                rule.count -= 1
                if rule.count == 0:
                    self._queue.remove(rule)
                return rule.kind
        k = self.knobs
        rates = (
            ("503", k.rate_503),
            ("429", k.rate_429),
            ("reset", k.rate_reset),
            ("reset-after", k.rate_reset_after),
            ("hang", k.rate_hang),
        )
        for kind, rate in rates:
            if rate and self._rng.random() < rate:
                return kind
        if k.evict_rate and self._rng.random() < k.evict_rate:
            return "evict"
        return None


_NAMED = {"sandboxes": "{name}", "pools": "{name}", "execs": "{exec_id}"}


def route_of(path: str) -> str:
    """The route template of ``path``: ``/sandboxes/sb-1/files`` is ``/sandboxes/{name}/files``."""
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] in _NAMED:
        parts[1] = _NAMED[parts[0]]
    return "/" + "/".join(parts)


def _sandbox_in(path: str) -> str | None:
    parts = path.strip("/").split("/")
    return parts[1] if len(parts) >= 2 and parts[0] == "sandboxes" else None


class FaultMiddleware:
    """Wraps the API app: latency first, then the drawn fault (or the call itself)."""

    def __init__(self, app: Asgi, injector: FaultInjector, evict: Evictor) -> None:
        self._app = app
        self._injector = injector
        self._evict = evict

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith(EXEMPT_PREFIXES):
            await self._app(scope, receive, send)
            return
        knobs = self._injector.knobs
        if knobs.latency_ms:
            await asyncio.sleep(knobs.latency_ms / 1000)
        fault = self._injector.draw(scope["method"], path)
        if fault is not None:
            self._injector.count(fault, path)
            log.info("injecting %s into %s %s", fault, scope["method"], path)
        if fault == "evict":
            await self._evict(_sandbox_in(path))
        elif fault == "503":
            await _error(send, 503, "unavailable", "the API server is temporarily unavailable", knobs.retry_after_sec)
            return
        elif fault == "429":
            await _error(send, 429, "rate_limited", "too many requests", knobs.retry_after_sec)
            return
        elif fault == "reset":
            await _reset(send)
            return
        elif fault == "reset-after":
            await self._app(scope, receive, _discarding)
            await _reset(send)
            return
        elif fault == "hang":
            await asyncio.sleep(knobs.hang_sec)
            await _error(send, 503, "unavailable", "the API server timed out", knobs.retry_after_sec)
            return
        await self._app(scope, receive, send)


async def _discarding(message: Message) -> None:
    """A response the client never gets (``reset-after``): the call ran, its answer is lost."""


async def _error(send: Send, status: int, kind: str, message: str, retry_after: float) -> None:
    body = json.dumps({"error": {"kind": kind, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"retry-after", f"{retry_after:g}".encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _reset(send: Send) -> None:
    """Drop the connection with a TCP RST and no response.

    Uvicorn's ``send`` is a bound method of its request cycle, which holds the connection's
    transport; with ``SO_LINGER`` 0 an abort sends RST instead of FIN, as a crashed or
    overloaded API server behind a load balancer would."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:  # not uvicorn: start a response and break it off mid-way
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
        raise ConnectionResetError("injected connection reset")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    for _ in range(3):  # let the protocol see connection_lost before the app returns
        await asyncio.sleep(0)
