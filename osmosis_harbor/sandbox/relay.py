"""The policy relay: a sandbox reaches its rollout's chat endpoint on this machine, and nothing
else of the host.

A policy endpoint on the host's loopback (the scripted policy of a demo, a local inference
server) used to need ``host_network=True``, which also hands the workflow every other loopback
service: the rollout server's cancel and status API, the local registry, anything. Instead,
local sandboxes sit on their own bridge (``docker/network.py``) and the host runs this relay on
that bridge's gateway address, on an ephemeral port. Each rollout registers its chat URL and
gets an unguessable token; the sandbox is given ``http://<gateway>:<port>/<token><path>``, and
the relay forwards only requests under that path, to that one upstream (``relay_app.py``).
The token is dropped when the rollout ends, so a URL the workflow wrote down is dead afterwards.

The relay is owned by whoever runs rollouts (a ``HarborBackend``), starts on the first
registration and stops with its owner. It serves from a thread of its own, with its own event
loop (uvicorn, without signal handlers off the main thread), so no request, however slow,
touches the caller's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import uvicorn

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.relay_app import RelayApp, RelayLimits, RelayRoute

__all__ = ["PolicyRelay", "RelayRegistration", "sandbox_gateway"]

log = logging.getLogger(__name__)
_STOP_TIMEOUT_SEC = 10.0


def sandbox_gateway() -> str:
    """Where local sandboxes reach this host: the gateway of their Docker bridge."""
    from osmosis_harbor.sandbox.docker.network import sandbox_network

    return sandbox_network().gateway


@dataclass(frozen=True)
class RelayRegistration:
    """One rollout's way through the relay; ``close()`` (or leaving the ``with``) ends it."""

    token: str
    sandbox_url: str
    _relay: PolicyRelay = field(repr=False)

    def close(self) -> None:
        self._relay.unregister(self.token)

    def __enter__(self) -> RelayRegistration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PolicyRelay:
    """Forwards each registered token's requests to its rollout's chat endpoint only."""

    def __init__(self, bind_host: Callable[[], str] = sandbox_gateway, limits: RelayLimits | None = None) -> None:
        self._bind_host = bind_host
        self._limits = limits
        self._routes: dict[str, RelayRoute] = {}
        self._guard = threading.Lock()
        self._address: tuple[str, int] | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._app: RelayApp | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) the relay listens on, once started."""
        return self._address

    async def register(self, upstream_url: str) -> RelayRegistration:
        """Start the relay if needed (off the event loop: it asks Docker for the gateway) and
        route a new token to ``upstream_url``."""
        return await asyncio.to_thread(self.register_sync, upstream_url)

    def register_sync(self, upstream_url: str) -> RelayRegistration:
        parts = urlsplit(upstream_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"the policy relay forwards to http(s) URLs only, not {upstream_url!r}")
        host, port = self._start()
        token = secrets.token_urlsafe(32)
        route = RelayRoute(origin=f"{parts.scheme}://{parts.netloc}", prefix=parts.path.rstrip("/"))
        with self._guard:
            self._routes[token] = route
        query = f"?{parts.query}" if parts.query else ""
        return RelayRegistration(token, f"http://{host}:{port}/{token}{parts.path}{query}", self)

    def unregister(self, token: str) -> None:
        with self._guard:
            self._routes.pop(token, None)

    def active(self) -> int:
        """How many tokens are routed now."""
        with self._guard:
            return len(self._routes)

    def _lookup(self, token: str) -> RelayRoute | None:
        with self._guard:
            return self._routes.get(token)

    def _start(self) -> tuple[str, int]:
        with self._guard:
            if self._address is not None:
                return self._address
            host = self._bind_host()
            sock = _listen(host, settings.current().relay_port)
            limits = self._limits or _limits_from_settings()
            self._app = RelayApp(self._lookup, self._upstream_client, limits)
            config = uvicorn.Config(
                self._app,
                lifespan="off",
                log_config=None,  # uvicorn's own would reconfigure this whole process's logging
                log_level=None,
                access_log=False,
                server_header=False,
                limit_concurrency=settings.current().relay_max_connections,
                timeout_keep_alive=5,
                timeout_graceful_shutdown=2,  # a backstop: close() ends the calls in flight first
            )
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(
                target=asyncio.run, args=(self._serve(sock, limits),), name="osmosis-policy-relay", daemon=True
            )
            self._thread.start()
            self._address = (host, int(sock.getsockname()[1]))
            log.info("policy relay listening on %s:%d", *self._address)
            return self._address

    async def _serve(self, sock: socket.socket, limits: RelayLimits) -> None:
        timeout = httpx.Timeout(limits.timeout_sec, connect=10.0)
        # trust_env=False: a proxy from the environment must not carry loopback traffic away.
        self._loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False) as client:
            self._client = client
            assert self._server is not None
            try:
                await self._server.serve(sockets=[sock])
            except Exception:  # in a thread of its own: say so, or the relay dies silently
                log.exception("the policy relay on %s stopped", sock.getsockname())
                raise
            finally:
                sock.close()

    def _upstream_client(self) -> httpx.AsyncClient:
        assert self._client is not None  # set before the server accepts anything
        return self._client

    def close(self) -> None:
        """Stop serving and forget every route (idempotent); a later register starts anew."""
        with self._guard:
            self._routes.clear()
            server, thread, app, loop = self._server, self._thread, self._app, self._loop
            self._server = self._thread = self._app = self._loop = None
            self._address = None
        if app is not None and loop is not None:
            try:
                loop.call_soon_threadsafe(app.cancel_in_flight)
            except RuntimeError:  # the loop already ended
                pass
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(_STOP_TIMEOUT_SEC)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket: connections queue from here on, before the server loop runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(256)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"the policy relay cannot listen on {host}:{port} ({exc.strerror}): free the port or change "
            "OSMOSIS_HARBOR_RELAY_PORT (0 picks a free one)"
        ) from exc
    return sock


def _limits_from_settings() -> RelayLimits:
    current = settings.current()
    return RelayLimits(
        max_request_bytes=current.relay_max_request_bytes,
        max_response_bytes=current.relay_max_response_bytes,
        timeout_sec=current.relay_timeout_sec,
    )
