"""One rollout, end to end, from the command line (``python -m osmosis_harbor rollout``).

It runs exactly the production path on this machine: ``HarborBackend`` behind the real
osmosis rollout server on 127.0.0.1, the osmosis client posting the rollout and polling
for its result, the trial in a local Docker sandbox (host networking, so the workflow can
reach a policy endpoint on this machine). Without a real endpoint, ``--scripted-reply``
starts a scripted one, which is enough to see a workflow, its sandbox and its grader work.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.types import RolloutResultResponse

from osmosis_harbor import settings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serve_locally(backend: Any, *, lifespan: Any = None) -> AsyncIterator[str]:
    """``create_rollout_server(backend=...)`` on 127.0.0.1 in this event loop; yields its URL.

    Leaving the block stops the server at once, as bare uvicorn would: osmosis waits briefly
    for in-flight rollouts, cancels the rest and calls ``backend.shutdown()``. No drain is
    needed: the caller has collected its results before leaving (``osmosis_harbor.serving.server.serve``
    is the way to serve a backend to controllers)."""
    import uvicorn
    from osmosis_ai.rollout.server import create_rollout_server

    from osmosis_harbor.serving.server import add_status_route

    app = add_status_route(create_rollout_server(backend=backend, lifespan=lifespan, configure_logging=False), backend)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the rollout server stopped during start-up")
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def run_one_rollout(
    *,
    backend: Any,
    prompt: str,
    chat_completions_url: str,
    api_key: str | None,
    label: str | None,
    metadata: dict[str, Any] | None,
    grade: bool,
) -> RolloutResultResponse:
    from osmosis_ai.rollout.client import RolloutClient

    async with serve_locally(backend) as url:
        client = RolloutClient(url=url)
        try:
            return await client.run_rollout(
                initial_messages=[{"role": "user", "content": prompt}],
                chat_completions_url=chat_completions_url,
                rollout_id=f"local-{uuid.uuid4().hex[:10]}",
                llm_api_key=api_key,
                label=label,
                metadata=metadata,
                grade=grade,
            )
        finally:
            await client.aclose()


# osmosis_ai's own override of where its server saves each rollout's files (default ~/.osmosis),
# read whenever it saves one.
ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"


@contextlib.contextmanager
def local_trajectories() -> Iterator[Path | None]:
    """Where the osmosis server saves this command's trajectories: a temporary directory,
    removed afterwards, unless ``OSMOSIS_HARBOR_KEEP_HOME`` keeps them in ~/.osmosis.

    Scoped: the server's artifact root is pointed there for the block and restored after
    it; ``$HOME`` (which locks, caches and credentials live under) is never touched."""
    if settings.current().keep_home:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="osmosis-harbor-home-") as root:
        with settings.scoped_variable(ARTIFACT_ROOT_ENV, root):
            yield Path(root)


__all__ = ["local_trajectories", "run_one_rollout", "serve_locally"]
