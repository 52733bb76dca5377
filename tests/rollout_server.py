"""Serving a HarborBackend through the real osmosis rollout server on 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from osmosis_ai.rollout.client import RolloutClient

from osmosis_harbor.serving.local import serve_locally as serve

__all__ = ["client_for", "serve"]


@contextlib.asynccontextmanager
async def client_for(url: str) -> AsyncIterator[RolloutClient]:
    client = RolloutClient(url=url)
    try:
        yield client
    finally:
        await client.aclose()
