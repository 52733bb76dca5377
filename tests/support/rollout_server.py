"""Serving a HarborBackend through the real osmosis rollout server on 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from osmosis_ai.rollout.client import RolloutClient

from osmosis_harbor.serving.local import serve_locally as serve

__all__ = ["client_for", "http_to", "serve"]


@contextlib.asynccontextmanager
async def client_for(url: str) -> AsyncIterator[RolloutClient]:
    client = RolloutClient(url=url)
    try:
        yield client
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def http_to(url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client for the server's routes that opens a connection per request. A kept
    one would be reused after a test's long waits just as uvicorn closes it (idle for 5 s), and
    the request would fail with ``ReadError``: a race of the test's client, not of the server."""
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        yield http
