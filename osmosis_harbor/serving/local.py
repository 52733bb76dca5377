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
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from osmosis_ai.rollout.types import RolloutResultResponse

from osmosis_harbor import settings
from osmosis_harbor.prewarm.startup import STOP_HOOK


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _SignalledServer(uvicorn.Server):
    """uvicorn's server that also tells its caller about the signal it holds back."""

    def __init__(
        self, config: uvicorn.Config, loop: asyncio.AbstractEventLoop, on_signal: Callable[[], None] | None
    ) -> None:
        super().__init__(config)
        self._loop = loop
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._on_signal is not None:  # a signal handler runs between bytecodes: hand over to the loop
            self._loop.call_soon_threadsafe(self._on_signal)


@contextlib.asynccontextmanager
async def serve_locally(
    backend: Any, *, lifespan: Any = None, on_signal: Callable[[], None] | None = None
) -> AsyncIterator[str]:
    """``create_rollout_server(backend=...)`` on 127.0.0.1 in this event loop; yields its URL.

    Leaving the block stops the server at once, as bare uvicorn would: osmosis waits briefly
    for in-flight rollouts, cancels the rest and calls ``backend.shutdown()``. No drain is
    needed: the caller has collected its results before leaving (``osmosis_harbor.serving.server.serve``
    is the way to serve a backend to controllers).

    uvicorn holds SIGINT and SIGTERM while it serves (it raises them again once it has shut
    down), so the block itself never sees Ctrl-C: ``on_signal`` is called, on the event loop,
    when one arrives.

    An interruption of the backend's shutdown (``KeyboardInterrupt``, ``SystemExit``, a
    cancellation, a test's timeout: any ``BaseException`` that is not an ``Exception``) is
    raised again once the server has stopped: uvicorn only logs what the app's lifespan raises
    and ends normally, which made an interrupted shutdown look like a finished one."""
    # FastAPI and the osmosis server load only when a backend is served, not for local trajectories.
    from osmosis_ai.rollout.server import create_rollout_server

    from osmosis_harbor.serving.server import KEEP_ALIVE_SEC, add_status_route

    interrupted: list[BaseException] = []

    @contextlib.asynccontextmanager
    async def watched(app: Any) -> AsyncIterator[None]:
        """The caller's lifespan, seeing what the shutdown raises: osmosis runs the backend's
        shutdown inside it (on the same exit stack, entered after it)."""
        try:
            if lifespan is None:
                yield
            else:
                async with lifespan(app):
                    yield
        except Exception:
            raise  # uvicorn logs it: the server's own failure, as before
        except BaseException as exc:
            interrupted.append(exc)
            raise

    app = add_status_route(create_rollout_server(backend=backend, lifespan=watched, configure_logging=False), backend)
    port = _free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_keep_alive=KEEP_ALIVE_SEC
    )
    server = _SignalledServer(config, asyncio.get_running_loop(), on_signal)

    def stop(_reason: str) -> None:  # the app's STOP_HOOK (a background prewarm failed)
        server.should_exit = True

    setattr(app.state, STOP_HOOK, stop)
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
        if interrupted:
            raise interrupted[0]


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
    """Post one rollout to a local server and wait for its result. On Ctrl-C the rollout is
    cancelled through the server at once (its trial stops, its sandbox goes) and the
    interrupt propagates; otherwise osmosis' shutdown would first wait out its drain."""
    from osmosis_ai.rollout.client import RolloutClient

    rollout_id = f"local-{uuid.uuid4().hex[:10]}"
    interrupted = asyncio.Event()
    async with serve_locally(backend, on_signal=interrupted.set) as url:
        client = RolloutClient(url=url)
        run = asyncio.ensure_future(
            client.run_rollout(
                initial_messages=[{"role": "user", "content": prompt}],
                chat_completions_url=chat_completions_url,
                rollout_id=rollout_id,
                llm_api_key=api_key,
                label=label,
                metadata=metadata,
                grade=grade,
            )
        )
        stop = asyncio.ensure_future(interrupted.wait())
        try:
            await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                with contextlib.suppress(Exception):  # else the server's own shutdown cancels it
                    await client.cancel_rollout(rollout_id)
                # Leaving the server block re-raises the signal, which ends asyncio.run with
                # KeyboardInterrupt for a main task that ends cancelled.
                raise asyncio.CancelledError
            return run.result()
        finally:
            for pending in (run, stop):
                pending.cancel()
            await asyncio.gather(run, stop, return_exceptions=True)
            await client.aclose()


# osmosis_ai's own override of where its server saves each rollout's files (default ~/.osmosis),
# read whenever it saves one.
ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"


@contextlib.contextmanager
def local_trajectories(*, keep_home: bool) -> Iterator[Path | None]:
    """Where the osmosis server saves this command's trajectories: a temporary directory,
    removed afterwards, unless ``keep_home`` (``OSMOSIS_HARBOR_KEEP_HOME``) keeps them in ~/.osmosis.

    Scoped: the server's artifact root is pointed there for the block and restored after
    it; ``$HOME`` (which locks, caches and credentials live under) is never touched."""
    if keep_home:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="osmosis-harbor-home-") as root:
        with settings.scoped_variable(ARTIFACT_ROOT_ENV, root):
            yield Path(root)


__all__ = ["local_trajectories", "run_one_rollout", "serve_locally"]
