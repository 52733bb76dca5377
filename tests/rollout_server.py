"""Serving a HarborBackend through the real osmosis rollout server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server

from osmosis_harbor.server import add_status_route


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serve(backend: Any, *, lifespan: Any = None) -> AsyncIterator[str]:
    """Run ``create_rollout_server(backend=...)`` in this event loop; yields its URL."""
    app = add_status_route(create_rollout_server(backend=backend, lifespan=lifespan, configure_logging=False),
                           backend)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # surface a start-up failure (e.g. a failing lifespan)
                raise RuntimeError("rollout server exited during start-up")
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def client_for(url: str) -> AsyncIterator[RolloutClient]:
    client = RolloutClient(url=url)
    try:
        yield client
    finally:
        await client.aclose()
