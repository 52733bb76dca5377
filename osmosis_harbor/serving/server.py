"""Serving helpers on top of ``osmosis_ai.rollout.server.create_rollout_server``.

``serve(app)`` is how to run the app: uvicorn, except that SIGTERM (or SIGINT, or
``server.request_drain()``) starts a drain (``osmosis_harbor.serving.drain``) and the listening socket
closes only after it, so that the controller receives the terminal state of every rollout the
server finished or cancelled. Bare ``uvicorn.run(app)`` closes the socket first: osmosis'
own shutdown then finishes and cancels rollouts nobody can poll any more.

The v0.3 guide documents ``GET /rollout/{rollout_id}/status``, but the 0.3.8 server does not
route it (its controller client observes status through result long-polling instead).
``add_status_route`` adds the route, answering from ``backend.rollout_status`` (the
backend's live or retained state; 404 for ids it never saw), and leaves an app that
already has it untouched.
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from osmosis_ai.rollout.backend.base import ExecutionBackend

from osmosis_harbor import settings
from osmosis_harbor.prewarm.startup import STOP_HOOK
from osmosis_harbor.serving.drain import (
    DEFAULT_DELIVERY_SEC,
    DEFAULT_GRACE_SEC,
    Drain,
    DrainPolicy,
    install_drain,
)

STATUS_PATH = "/rollout/{rollout_id}/status"
# Once the drain is over nothing may still be long-polling for a live rollout; this bounds
# uvicorn's wait for slow clients before the lifespan shutdown (sandbox cleanup) runs.
_CONNECTIONS_CLOSE_SEC = 5.0
# An idle connection is kept longer than clients keep theirs (httpx: 5 s, uvicorn's own default
# too): at equal times a client may send its next request down a connection the server is
# closing, and osmosis-ai's `eval run` halts its dispatch on the ReadError that gives.
KEEP_ALIVE_SEC = 75

log = logging.getLogger("uvicorn.error")


def add_status_route(app: FastAPI, backend: ExecutionBackend) -> FastAPI:
    """Route ``GET /rollout/{rollout_id}/status`` to ``backend.rollout_status``."""
    if any(getattr(route, "path", None) == STATUS_PATH for route in app.routes):
        return app

    @app.get(STATUS_PATH)
    async def rollout_status(rollout_id: str) -> dict[str, Any]:
        state = backend.rollout_status(rollout_id)
        if state is None:
            raise HTTPException(status_code=404, detail="unknown rollout_id")
        return state

    return app


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains before the socket closes.

    A second signal stops waiting: uvicorn's own shutdown runs at once (osmosis then cancels
    what is left and the backend removes its sandboxes), and the process ends by that signal.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self.failure: str | None = None  # why the server stopped itself (``serve`` then exits 1)
        self._drain_requested = False
        self._drain_task: asyncio.Task[None] | None = None

    def stop_failing(self, reason: str) -> None:
        """The app's ``STOP_HOOK``: the server cannot do its job (a background prewarm failed)."""
        self.failure = reason
        self.request_drain()

    def request_drain(self) -> None:
        """What SIGTERM does: drain, then exit. Safe to call from any thread, more than once."""
        self._drain_requested = True
        self.drain.begin()  # admissions are refused from now on, not from the next tick

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_requested:
            super().handle_exit(sig, frame)  # impatience: stop now, exit by the signal
        else:
            self.request_drain()  # not recorded: a completed drain exits with status 0

    async def on_tick(self, counter: int) -> bool:
        if self._drain_requested and self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain_then_exit())
        return await super().on_tick(counter)

    async def _drain_then_exit(self) -> None:
        try:
            await self.drain.run()
        except Exception:  # a broken drain must not keep the server up forever
            log.exception("Drain failed; shutting down without it")
        finally:
            self.should_exit = True

    async def shutdown(self, sockets: Any = None) -> None:
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_task.cancel()
            await asyncio.gather(self._drain_task, return_exceptions=True)
        await super().shutdown(sockets=sockets)


def draining_server(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_grace_sec: float = DEFAULT_GRACE_SEC,
    delivery_sec: float = DEFAULT_DELIVERY_SEC,
    **uvicorn_options: Any,
) -> DrainingServer:
    """The server ``serve`` runs, for callers that run it in their own event loop
    (``await server.serve()``) or drain it from code (``server.request_drain()``)."""
    drain = install_drain(app, DrainPolicy(grace_sec=shutdown_grace_sec, delivery_sec=delivery_sec))
    uvicorn_options.setdefault("timeout_graceful_shutdown", _CONNECTIONS_CLOSE_SEC)
    uvicorn_options.setdefault("lifespan", "on")
    uvicorn_options.setdefault("timeout_keep_alive", KEEP_ALIVE_SEC)
    server = DrainingServer(uvicorn.Config(app, host=host, port=port, **uvicorn_options), drain)
    setattr(app.state, STOP_HOOK, server.stop_failing)
    return server


def serve(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    shutdown_grace_sec: float = DEFAULT_GRACE_SEC,
    delivery_sec: float = DEFAULT_DELIVERY_SEC,
    **uvicorn_options: Any,
) -> None:
    """Serve a ``create_rollout_server`` app until SIGTERM/SIGINT, then drain and exit.

    The drain: ``POST /rollout`` answers 503 with ``Retry-After``, ``GET /health`` says
    ``draining``; in-flight rollouts get ``shutdown_grace_sec`` to finish and are cancelled
    after it; results are served until each terminal one was polled, or at most
    ``delivery_sec`` after the grace period. Then the socket closes, the backend shuts down
    and the process exits 0; with 1 when the server stopped itself (a background prewarm
    failed). ``port``: else ``$_OSMOSIS_ROLLOUT_PORT`` (what osmosis-ai's harness gives its
    rollout server), else 8000. ``uvicorn_options`` go to ``uvicorn.Config``."""
    if port is None:
        port = settings.current().rollout_port or 8000
    server = draining_server(
        app, host=host, port=port, shutdown_grace_sec=shutdown_grace_sec, delivery_sec=delivery_sec, **uvicorn_options
    )
    server.run()
    if server.failure is not None:
        raise SystemExit(1)


__all__ = ["DrainingServer", "add_status_route", "draining_server", "serve"]
