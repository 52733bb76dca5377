"""Serving helpers on top of ``osmosis_ai.rollout.server.create_rollout_server``.

The v0.3 guide documents ``GET /rollout/{rollout_id}/status``, but the 0.3.8 server does not
route it (its controller client observes status through result long-polling instead).
``add_status_route`` adds the route, answering from ``backend.rollout_status`` (the
backend's live or retained state; 404 for ids it never saw), and leaves an app that
already has it untouched.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException
from osmosis_ai.rollout.backend.base import ExecutionBackend

STATUS_PATH = "/rollout/{rollout_id}/status"


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
