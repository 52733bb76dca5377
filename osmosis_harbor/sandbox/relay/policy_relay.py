"""The policy relay: a sandbox reaches its rollout's chat endpoint on this machine, and nothing
else of the host.

A policy endpoint on the host's loopback (the scripted policy of a demo, a local inference
server) is out of a sandbox's reach unless it shares the host's network, which would also hand
the workflow every other loopback service: the rollout server's cancel and status API, the local
registry, anything. So local sandboxes sit on their own bridge (``docker/network.py``) and the
host runs this relay on that bridge's gateway address, on an ephemeral port. Each rollout registers its chat URL and
gets an unguessable token; the sandbox is given ``http://<gateway>:<port>/<token><path>``, and
the relay forwards only requests under that path, to that one upstream (``relay/http.py``).
The token is dropped when the rollout ends, so a URL the workflow wrote down is dead afterwards.

The relay is owned by whoever runs rollouts (a ``HarborBackend``), starts on the first
registration and stops with its owner. It serves from a thread of its own, with its own event
loop, so no request, however slow, touches the caller's event loop. Its bounds per sandbox and
per rollout are ``relay/limits.py``'s; what it refused of a rollout's calls is in the registration's
``record`` (``relay/refusals.py``), which the rollout's outcome reads.
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

import httpcore

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.relay.http import RelayRoute, RelayServer
from osmosis_harbor.sandbox.relay.limits import RelayLimits
from osmosis_harbor.sandbox.relay.refusals import RelayRecord

__all__ = ["PolicyRelay", "RelayRegistration", "limits_from_settings", "sandbox_gateway"]

log = logging.getLogger(__name__)
_STOP_TIMEOUT_SEC = 10.0
_DRAIN_SEC = 2.0  # a stopping relay waits this long for its connections to end
_BACKLOG = 1024  # connections the kernel queues before the relay's loop accepts them


def sandbox_gateway() -> str:
    """Where local sandboxes reach this host: the gateway of their Docker bridge."""
    # Only the local SDKs call this: the Docker SDK is the optional ``docker`` extra.
    from osmosis_harbor.sandbox.docker.engine import sandbox_network

    return sandbox_network().gateway


@dataclass(frozen=True)
class RelayRegistration:
    """One rollout's way through the relay; ``close()`` (or leaving the ``with``) ends it."""

    token: str
    sandbox_url: str
    record: RelayRecord = field(repr=False)
    _relay: PolicyRelay = field(repr=False)

    def close(self) -> None:
        self._relay.unregister(self.token)

    def __enter__(self) -> RelayRegistration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PolicyRelay:
    """Forwards each registered token's requests to its rollout's chat endpoint only."""

    def __init__(
        self,
        *,
        config: settings.Settings,
        bind_host: Callable[[], str] = sandbox_gateway,
        limits: RelayLimits | None = None,
    ) -> None:
        """``config``: its owner's settings (the backend's), for its port and bounds."""
        self._config = config
        self._bind_host = bind_host
        self._limits = limits
        self._routes: dict[str, RelayRoute] = {}
        self._guard = threading.Lock()
        self._address: tuple[str, int] | None = None
        self._thread: threading.Thread | None = None
        self._client: httpcore.AsyncConnectionPool | None = None
        self._server: RelayServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

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
        route = RelayRoute(
            f"{parts.scheme}://{parts.netloc}", parts.netloc.rpartition("@")[2].encode("ascii"), parts.path.rstrip("/")
        )
        with self._guard:
            self._routes[token] = route
        query = f"?{parts.query}" if parts.query else ""
        return RelayRegistration(token, f"http://{host}:{port}/{token}{parts.path}{query}", route.record, self)

    def unregister(self, token: str) -> None:
        with self._guard:
            self._routes.pop(token, None)

    def active(self) -> int:
        """How many tokens are routed now."""
        with self._guard:
            return len(self._routes)

    def stats(self) -> dict[str, int]:
        """What the relay holds now: connections, overflow, buffered body bytes, calls."""
        server = self._server
        return server.admission.stats() if server is not None else {}

    def _lookup(self, token: str) -> RelayRoute | None:
        return self._routes.get(token)  # one dict read is atomic: no lock on every call

    def _start(self) -> tuple[str, int]:
        with self._guard:
            if self._address is not None:
                return self._address
            host = self._bind_host()
            config = self._config
            sock = _listen(host, config.relay_port)
            try:
                server = RelayServer(self._lookup, self._upstream_client, self._limits or limits_from_settings(config))
            except ConfigError:
                sock.close()
                raise
            started = threading.Event()
            self._server = server
            self._thread = threading.Thread(
                target=asyncio.run, args=(self._serve(sock, server, started),), name="osmosis-policy-relay", daemon=True
            )
            self._thread.start()
            started.wait(_STOP_TIMEOUT_SEC)
            self._address = (host, int(sock.getsockname()[1]))
            log.info("policy relay listening on %s:%d", *self._address)
            return self._address

    async def _serve(self, sock: socket.socket, relay: RelayServer, started: threading.Event) -> None:
        # Upstream connections are bounded by the calls the relay admits, not by a pool every
        # rollout would queue on. No proxy from the environment carries loopback traffic away.
        self._loop = asyncio.get_running_loop()
        stop = self._stop = asyncio.Event()
        started.set()
        async with httpcore.AsyncConnectionPool(max_connections=None, max_keepalive_connections=64) as pool:
            self._client = pool
            try:
                server = await asyncio.start_server(relay, sock=sock, backlog=_BACKLOG)
            except Exception:  # in a thread of its own: say so, or the relay dies silently
                log.exception("the policy relay on %s could not start", sock.getsockname())
                sock.close()
                raise
            async with server:
                await stop.wait()
                server.close()  # no new connections; the open ones end (a waiting call gets a 503)
                open_calls = relay.stop()
                if open_calls:
                    await asyncio.wait(open_calls, timeout=_DRAIN_SEC)

    def _upstream_client(self) -> httpcore.AsyncConnectionPool:
        assert self._client is not None  # set before the server accepts anything
        return self._client

    def close(self) -> None:
        """Stop serving and forget every route (idempotent); a later register starts anew."""
        with self._guard:
            self._routes.clear()
            thread, loop, stop = self._thread, self._loop, self._stop
            self._thread = self._server = self._loop = self._stop = None
            self._address = None
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already ended
                pass
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
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"the policy relay cannot listen on {host}:{port} ({exc.strerror}): free the port or change "
            "OSMOSIS_HARBOR_RELAY_PORT (0 picks a free one)"
        ) from exc
    return sock


def limits_from_settings(current: settings.Settings) -> RelayLimits:
    """The relay's bounds as ``current`` says (a ``ConfigError`` names a contradiction)."""
    return RelayLimits(
        max_request_bytes=current.relay_max_request_bytes,
        max_response_bytes=current.relay_max_response_bytes,
        timeout_sec=current.relay_timeout_sec,
        max_connections=current.relay_max_connections,
        reserved_connections=current.relay_reserved_connections,
        max_source_connections=current.relay_max_source_connections,
        max_token_calls=current.relay_max_token_calls,
        max_buffered_bytes=current.relay_max_buffered_bytes,
        max_token_buffered_bytes=current.relay_max_token_buffered_bytes,
        header_timeout_sec=current.relay_header_timeout_sec,
        body_timeout_sec=current.relay_body_timeout_sec,
    )
