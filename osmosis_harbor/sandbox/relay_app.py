"""The policy relay's HTTP side: one ASGI app that forwards a token's requests to its endpoint.

A sandbox calls ``http://<gateway>:<port>/<token>/<path>``. The token names one registered
route (``relay.py``); the rest of the path must lie under the path of the rollout's original
chat URL (clients append ``/chat/completions`` and the like to that base). Anything else is
refused without touching an upstream: an unknown token (403), a path outside the prefix or
with dot segments, however encoded (404). What passes is forwarded to that one upstream with
its headers (the Authorization header included: the policy endpoint checks the key, not us)
and the response is streamed back. Request bodies and response bodies are bounded
(``RelayLimits``), so a sandbox can neither make the host buffer a flood nor stream one into it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from urllib.parse import unquote

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

__all__ = ["RelayApp", "RelayLimits", "RelayRoute", "forwardable_path"]

log = logging.getLogger(__name__)

# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the relay sets itself.
_DROPPED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass(frozen=True)
class RelayRoute:
    """Where one token's requests go: ``origin`` (scheme://host:port) and the path ``prefix``
    they must stay under (the original URL's path, without its trailing slash)."""

    origin: str
    prefix: str


@dataclass(frozen=True)
class RelayLimits:
    max_request_bytes: int
    max_response_bytes: int
    timeout_sec: float


class _TooLarge(Exception):
    pass


def forwardable_path(raw_path: str, prefix: str) -> bool:
    """Whether ``raw_path`` (still percent-encoded) stays under ``prefix`` once decoded by
    anyone: no ``.``/``..`` segment, no encoded slash or backslash, and the prefix matched on
    a segment boundary."""
    decoded = unquote(raw_path)
    if "\\" in decoded or "\x00" in decoded or decoded.count("/") != raw_path.count("/"):
        return False
    if any(part in (".", "..") for part in decoded.split("/")):
        return False
    return decoded == prefix or decoded.startswith(prefix + "/") or (prefix == "" and decoded.startswith("/"))


class RelayApp:
    """The ASGI app. ``lookup`` maps a token to its route (None: unknown or ended);
    ``client`` is the upstream client of the relay's own event loop. ``cancel_in_flight``
    (on that loop) ends the calls still waiting when the relay stops: their rollouts have
    ended, so each gets a 503 at once rather than holding the shutdown."""

    def __init__(
        self,
        lookup: Callable[[str], RelayRoute | None],
        client: Callable[[], httpx.AsyncClient],
        limits: RelayLimits,
    ) -> None:
        self._lookup = lookup
        self._client = client
        self._limits = limits
        self._stopping = False
        self._in_flight: set[asyncio.Task[object]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        task = asyncio.current_task()
        assert task is not None
        self._in_flight.add(task)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            response = await _handle(Request(scope, receive), self._lookup, self._client(), self._limits)
            await response(scope, receive, tracked)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            if not started:
                await PlainTextResponse("the policy relay stopped\n", status_code=503)(scope, receive, send)
        finally:
            self._in_flight.discard(task)

    def cancel_in_flight(self) -> None:
        self._stopping = True
        for task in list(self._in_flight):
            task.cancel()


async def _handle(
    request: Request, lookup: Callable[[str], RelayRoute | None], client: httpx.AsyncClient, limits: RelayLimits
) -> Response:
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    token, _, rest = raw.decode("latin-1").lstrip("/").partition("/")
    route = lookup(token)
    if route is None:
        return PlainTextResponse("unknown or expired relay token\n", status_code=403)
    path = "/" + rest
    if not forwardable_path(path, route.prefix):
        return PlainTextResponse("outside the rollout's chat endpoint\n", status_code=404)
    try:
        body = await _bounded_body(request, limits.max_request_bytes)
    except _TooLarge:
        return PlainTextResponse(f"request body over {limits.max_request_bytes} bytes\n", status_code=413)
    query = request.scope.get("query_string") or b""
    url = route.origin + path + (f"?{query.decode('latin-1')}" if query else "")
    headers = [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in _DROPPED]
    upstream = client.build_request(request.method, url, headers=headers, content=body)
    try:
        reply = await client.send(upstream, stream=True)
    except httpx.TimeoutException:
        return PlainTextResponse("the policy endpoint timed out\n", status_code=504)
    except httpx.HTTPError as exc:
        return PlainTextResponse(f"the policy endpoint is unreachable ({type(exc).__name__})\n", status_code=502)
    return StreamingResponse(
        _bounded_stream(reply, limits.max_response_bytes),
        status_code=reply.status_code,
        headers={k: v for k, v in reply.headers.items() if k.lower() not in _DROPPED},
        background=BackgroundTask(reply.aclose),
    )


async def _bounded_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _bounded_stream(reply: httpx.Response, limit: int) -> AsyncIterator[bytes]:
    """The upstream's bytes as they come (raw: its own content-encoding is passed on), cut
    off with the connection once over ``limit``."""
    size = 0
    async for chunk in reply.aiter_raw():
        size += len(chunk)
        if size > limit:
            log.warning("policy relay: a response from %s passed %d bytes; cut off", reply.url.host, limit)
            raise _TooLarge(f"response over {limit} bytes")
        yield chunk
