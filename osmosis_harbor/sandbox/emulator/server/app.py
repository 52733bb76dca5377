"""The emulator's HTTP API (FastAPI): SkyPilot's sandbox calls, plus ``/admin`` for the knobs.

Routes translate; `state.Emulator` decides. Every refusal leaves as ``{"error": {"kind",
"message"}}`` with the status SkyPilot's server would use, so the client raises the same class
for the same failure whatever produced it (see ``errors.KINDS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from osmosis_harbor import errors as engine_errors
from osmosis_harbor.sandbox.emulator.errors import KINDS, SandboxApiError
from osmosis_harbor.sandbox.emulator.server.faults import FaultInjector, FaultMiddleware
from osmosis_harbor.sandbox.emulator.server.state import Emulator
from osmosis_harbor.sandbox.emulator.wire import (
    CreateRequest,
    ExecRequest,
    ExecResult,
    ExecStarted,
    FaultRule,
    Knobs,
    PoolCreateRequest,
    PoolInfo,
    PoolResize,
    SandboxInfo,
    SecretValue,
    ServerStats,
    SnapshotResult,
)

__all__ = ["build_app"]

log = logging.getLogger(__name__)

REAP_INTERVAL_SEC = 5.0

# What the Docker SDK under the server raises, as (class, HTTP status, kind), most specific first.
_REFUSALS: list[tuple[type[Exception], int, str]] = [
    (engine_errors.SandboxNotFoundError, 404, "sandbox_not_found"),
    (engine_errors.PoolNotFoundError, 404, "pool_not_found"),
    (engine_errors.SandboxExistsError, 409, "sandbox_exists"),
    (engine_errors.PoolExistsError, 409, "pool_exists"),
    (engine_errors.PoolExhaustedError, 409, "pool_exhausted"),
    (engine_errors.ImageNotFoundError, 424, "image_pull"),
    (FileNotFoundError, 404, "file_not_found"),
    (IsADirectoryError, 400, "is_a_directory"),
    (NotImplementedError, 501, "not_supported"),
    (ValueError, 400, "invalid_request"),
    (NotADirectoryError, 400, "invalid_request"),
]


def _refusal(exc: BaseException) -> JSONResponse:
    status, kind = 500, "server_error"
    if isinstance(exc, SandboxApiError) and exc.status_code is not None:
        kind = next((k for k, cls in KINDS.items() if type(exc) is cls), kind)
        status = exc.status_code
    else:
        status, kind = next(((s, k) for cls, s, k in _REFUSALS if isinstance(exc, cls)), (status, kind))
    if status == 500:
        log.error("emulator call failed", exc_info=exc)
    message = str(exc) if not isinstance(exc, OSError) or exc.errno is None else _os_message(exc)
    return JSONResponse({"error": {"kind": kind, "message": message}}, status_code=status)


def _os_message(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno or 0, 'EIO')}: {exc.strerror}: {exc.filename}"


def build_app(emulator: Emulator, injector: FaultInjector, restart: Callable[[], None]) -> FaultMiddleware:
    """The API app wrapped in the fault middleware; ``restart`` re-executes the server."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        recovered = await emulator.recover()
        log.warning("skypilot-emulator up (pid %d): %d sandbox(es) recovered from the engine", os.getpid(), recovered)
        reaper = asyncio.create_task(_reap_forever(emulator))
        try:
            yield
        finally:
            reaper.cancel()

    app = FastAPI(title="skypilot-emulator", lifespan=lifespan)

    async def refused(_: Request, exc: Exception) -> JSONResponse:
        return _refusal(exc)

    # Handlers per class (not one for Exception, which Starlette re-raises after answering).
    handled: list[type[Exception]] = [SandboxApiError, engine_errors.SandboxError, LookupError, OSError]
    for cls in dict.fromkeys([*handled, *(c for c, _, _ in _REFUSALS)]):
        app.add_exception_handler(cls, refused)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": {"kind": "invalid_request", "message": str(exc.errors())}}, status_code=400)

    @app.get("/healthz")
    async def healthz() -> dict[str, int]:
        return {"pid": os.getpid()}

    @app.post("/sandboxes")
    async def create(req: CreateRequest) -> list[SandboxInfo]:
        return await emulator.create(req)

    @app.get("/sandboxes")
    async def ls() -> list[SandboxInfo]:
        return await emulator.ls()

    @app.get("/sandboxes/{name}")
    async def info(name: str) -> SandboxInfo:
        return await emulator.info(name)

    @app.delete("/sandboxes/{name}")
    async def terminate(name: str) -> dict[str, bool]:
        await emulator.terminate(name)
        return {"ok": True}

    @app.post("/sandboxes/{name}/exec")
    async def exec_start(name: str, req: ExecRequest) -> ExecStarted:
        return ExecStarted(exec_id=await emulator.exec_start(name, req))

    @app.get("/execs/{exec_id}")
    async def exec_wait(exec_id: str) -> ExecResult:
        try:
            return await emulator.exec_wait(exec_id)
        except LookupError as exc:
            return JSONResponse({"error": {"kind": "exec_lost", "message": str(exc)}}, status_code=404)  # type: ignore[return-value]

    @app.put("/sandboxes/{name}/files")
    async def write_bytes(name: str, path: str, request: Request) -> dict[str, bool]:
        await emulator.write_bytes(name, path, await request.body())
        return {"ok": True}

    @app.get("/sandboxes/{name}/files")
    async def read_bytes(name: str, path: str) -> Response:
        return Response(await emulator.read_bytes(name, path), media_type="application/octet-stream")

    @app.post("/sandboxes/{name}/snapshot")
    async def snapshot(name: str) -> SnapshotResult:
        return SnapshotResult(image=await emulator.snapshot(name))

    @app.post("/pools")
    async def create_pool(req: PoolCreateRequest) -> PoolInfo:
        return await emulator.create_pool(req)

    @app.get("/pools")
    async def list_pools() -> list[PoolInfo]:
        return await emulator.list_pools()

    @app.get("/pools/{name}")
    async def get_pool(name: str) -> PoolInfo:
        return await emulator.get_pool(name)

    @app.put("/pools/{name}")
    async def set_pool_size(name: str, req: PoolResize) -> PoolInfo:
        return await emulator.set_pool_size(name, req.replicas)

    @app.delete("/pools/{name}")
    async def delete_pool(name: str) -> dict[str, bool]:
        await emulator.delete_pool(name)
        return {"ok": True}

    # ── admin: the realism knobs ─────────────────────────────────────────────────────────

    @app.get("/admin/stats")
    async def stats() -> ServerStats:
        return ServerStats(
            pid=os.getpid(),
            calls=injector.calls,
            faults=dict(injector.injected),
            evicted=emulator.evicted,
            knobs=injector.knobs,
            calls_by_route=dict(injector.by_route),
            faults_by_sandbox={name: dict(faults) for name, faults in injector.by_sandbox.items()},
        )

    @app.put("/admin/knobs")
    async def set_knobs(knobs: Knobs) -> Knobs:
        injector.set_knobs(knobs)
        emulator.knobs = knobs
        return knobs

    @app.put("/admin/secrets/{name}")
    async def register_secret(name: str, secret: SecretValue) -> dict[str, bool]:
        """The account's secrets store (SkyPilot's Secrets Manager), in memory only."""
        emulator.register_secret(name, secret.value)
        return {"ok": True}

    @app.delete("/admin/secrets/{name}")
    async def forget_secret(name: str) -> dict[str, bool]:
        emulator.forget_secret(name)
        return {"ok": True}

    @app.post("/admin/faults")
    async def queue_fault(rule: FaultRule) -> dict[str, bool]:
        injector.queue(rule)
        return {"ok": True}

    @app.delete("/admin/faults")
    async def clear_faults() -> dict[str, bool]:
        injector.clear()
        emulator.evicted.clear()
        return {"ok": True}

    @app.post("/admin/evict/{name}")
    async def evict(name: str) -> dict[str, str | None]:
        return {"evicted": await emulator.evict(name)}

    @app.post("/admin/reap")
    async def reap_now() -> dict[str, int]:
        """One pass of the TTL reaper now, instead of at its next tick (for tests)."""
        return {"reaped": await emulator.reap_expired()}

    @app.post("/admin/restart")
    async def restart_server() -> JSONResponse:
        """Answer, then re-execute this process: same pid and port, nothing kept in memory."""
        return JSONResponse({"pid": os.getpid()}, background=BackgroundTask(restart))

    injector.exec_sandbox = emulator.exec_sandbox
    return FaultMiddleware(app, injector, emulator.evict)


async def _reap_forever(emulator: Emulator) -> None:
    """The TTL, server-side: a sandbox past its ``timeout=`` is removed even if nobody asks."""
    while True:
        await asyncio.sleep(REAP_INTERVAL_SEC)
        try:
            await emulator.reap_expired()
        except Exception:
            log.exception("emulator TTL reaper pass failed")
