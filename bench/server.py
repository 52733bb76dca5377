"""Serving a backend through the real osmosis rollout server, in this event loop.

The same arrangement as ``tests/rollout_server.py`` (kept separate so benchmarks never
import the test package): ``create_rollout_server`` + our status route, uvicorn on a free
port of 127.0.0.1, shut down (which drains and calls ``backend.shutdown()``) on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from osmosis_ai.rollout.server import create_rollout_server

from osmosis_harbor.server import add_status_route


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(backend: Any) -> AsyncIterator[str]:
    """Yield the base URL of a rollout server running ``backend``."""
    app = add_status_route(create_rollout_server(backend=backend, configure_logging=False), backend)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", access_log=False))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("rollout server exited during start-up")
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
