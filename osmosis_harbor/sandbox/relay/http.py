"""The policy relay's HTTP side: an HTTP/1.1 server that forwards a token's requests to its endpoint.

A sandbox calls ``http://<gateway>:<port>/<token>/<path>``. The token names one registered
route (``policy_relay.py``); the rest of the path must lie under the path of the rollout's original
chat URL (clients append ``/chat/completions`` and the like to that base). Anything else is
refused without touching an upstream: an unknown token (403), a path outside the prefix or
with dot segments, however encoded (404), a body declared (or taken as) JSON that is not
strict JSON (400: no upstream chokes on it). What passes is forwarded to that one upstream with
its headers (the Authorization header included: the policy endpoint checks the key, not us)
and the response is streamed back, bounded.

Every sandbox shares this server, so a connection counts against its sandbox from its first
byte (``relay/limits.py``), its request head must arrive within the header timeout and its body
within the body timeout, and a body is held (whole, before the upstream sees any of it) only
within the byte bounds. Refusals and failures are written to the rollout's ``RelayRecord``,
with whose fault they were (a failed upstream call's: ``relay/blame.py``). uvicorn offers none
of this (one limit for all connections, counted before their headers, no header timeout), hence
h11 on asyncio streams here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

import h11
import httpcore

from osmosis_harbor.sandbox.relay.blame import BODY_NOT_JSON, UPSTREAM_ERRORS, Reachability, body_refusal
from osmosis_harbor.sandbox.relay.limits import RELAY_FULL, Blame, Refusal, RelayAdmission, RelayLimits
from osmosis_harbor.sandbox.relay.refusals import RelayRecord

__all__ = ["RelayRoute", "RelayServer", "forwardable_path"]

log = logging.getLogger(__name__)

_READ_BYTES = 64 * 1024
_MAX_HEAD_BYTES = 64 * 1024  # request line and headers; beyond, h11 refuses the request (431)
_DRAIN_ABOVE = 64 * 1024  # wait for the sandbox to read only once this much is queued to it
_LINGER_SEC = 2.0  # how long a refused body is read and discarded, so that the refusal is read
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the relay sets itself.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length"}  # the relay sets both upstream
_STATUS_OF = {Blame.OWN: 429, Blame.INFRA: 503}  # unless _STATUS names the kind


@dataclass(frozen=True)
class RelayRoute:
    """Where one token's requests go: ``origin`` (scheme://host:port, whose host:port is
    ``host``) and the path ``prefix`` they must stay under (the original URL's path, without
    its trailing slash); ``record`` gathers what the relay refused of them."""

    origin: str
    host: bytes
    prefix: str
    record: RelayRecord = field(default_factory=RelayRecord, compare=False)


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


class RelayServer:
    """The connection handler of ``asyncio.start_server``. ``lookup`` maps a token to its route
    (None: unknown or ended); ``client`` is the upstream connection pool of the relay's own
    event loop (httpcore's, without httpx's layers over it: the relay is on every chat call).
    ``stop`` (on that loop) ends the calls still open when the relay stops: their rollouts have
    ended, so each gets a 503 at once rather than holding the shutdown."""

    def __init__(
        self,
        lookup: Callable[[str], RelayRoute | None],
        client: Callable[[], httpcore.AsyncConnectionPool],
        limits: RelayLimits,
    ) -> None:
        self.lookup = lookup
        self.client = client
        self.limits = limits
        self.admission = RelayAdmission(limits)
        wait = limits.timeout_sec
        self.timeouts = {"timeout": {"connect": min(10.0, wait), "read": wait, "write": wait, "pool": wait}}
        self.reachability = Reachability(client, wait)  # whose fault a failed call is (``relay/blame.py``)
        self.stopping = False
        self._open: set[asyncio.Task[object]] = set()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        refusal = self.admission.connect(source)
        if refusal is not None and refusal.kind != RELAY_FULL:
            writer.transport.abort()  # nothing read, nothing answered (the sandbox's own doing, or no room at all)
            return
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        connection = _Connection(self, reader, writer)
        try:
            await connection.serve(overflow=refusal)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            connection.answer_stopped()
        except (OSError, h11.ProtocolError):
            pass  # the sandbox hung up, stopped reading (TimeoutError) or spoke nonsense: nothing to answer
        finally:
            self._open.discard(task)
            self.admission.disconnect(source, overflow=refusal is not None)
            writer.close()

    def stop(self) -> list[asyncio.Task[object]]:
        """End every open connection; returns their tasks, to wait for."""
        self.stopping = True
        tasks = list(self._open)
        for task in tasks:
            task.cancel()
        return tasks


class _Connection:
    """One sandbox connection: request after request, while it keeps the connection alive."""

    def __init__(self, server: RelayServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.limits = server.limits
        self.reader = reader
        self.writer = writer
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD_BYTES)
        self.answering = False  # a response has begun in this cycle
        self.held = 0  # bytes of body the current call has reserved (``RelayAdmission.hold``)
        self.received = 0  # and has read

    async def serve(self, overflow: Refusal | None) -> None:
        while True:
            request = await self._head()
            if request is None:
                return
            if overflow is not None:  # the relay is full: tell this rollout why, and that it was not its fault
                route = self.server.lookup(_token(request))
                if route is not None:
                    route.record.refused(overflow)
                await self._answer(503, overflow.reason)
                return
            if not await self._call(request):
                return
            if self.http.our_state is not h11.DONE or self.http.their_state is not h11.DONE:
                return
            self.http.start_next_cycle()
            self.answering = False

    async def _next_event(self) -> object:
        while True:
            event = self.http.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.http.receive_data(await self.reader.read(_READ_BYTES))

    async def _head(self) -> h11.Request | None:
        """The next request's head, within the header timeout (None: closed, late or garbled)."""
        try:
            async with asyncio.timeout(self.limits.header_timeout_sec):
                event = await self._next_event()
        except TimeoutError:
            return None  # never a whole head: close, answer nothing (it may never read)
        except h11.RemoteProtocolError as exc:
            await self._answer(exc.error_status_hint, "malformed request")
            return None
        return event if isinstance(event, h11.Request) else None

    async def _call(self, request: h11.Request) -> bool:
        """Answer one request; True when the connection may carry another."""
        token = _token(request)
        route = self.server.lookup(token)
        if route is None:
            await self._answer(403, "unknown or expired relay token")
            return False
        target = request.target.decode("latin-1")
        path, _, query = ("/" + target.lstrip("/").partition("/")[2]).partition("?")
        if not forwardable_path(path, route.prefix):
            await self._answer(404, "outside the rollout's chat endpoint")
            return False
        admission = self.server.admission
        refusal = admission.begin_call(token)
        if refusal is not None:
            return await self._refuse(route, refusal)
        try:
            url = route.origin + path + (f"?{query}" if query else "")
            return await self._forward(request, token, route, url)
        finally:
            admission.end_call(token)

    async def _forward(self, request: h11.Request, token: str, route: RelayRoute, url: str) -> bool:
        admission = self.server.admission
        refusal: Refusal | None = None
        try:
            body = await self._body(token, _content_length(request))
            if isinstance(body, Refusal):
                refusal = body
            else:
                content = bytes(body[0]) if len(body) == 1 else b"".join(body)
                del body
                refusal = await body_refusal(request.headers, content)
            if refusal is None:
                headers = [(k, v) for k, v in request.headers if k not in _NOT_FORWARDED]
                headers += ((b"host", route.host), (b"content-length", str(len(content)).encode()))
                upstream = httpcore.Request(
                    request.method, url, headers=headers, content=content, extensions=self.server.timeouts
                )
                del content  # held by the upstream request only, until sent
                started = time.monotonic()
                try:
                    reply = await self.server.client().handle_async_request(upstream)
                except (httpcore.TimeoutException, *UPSTREAM_ERRORS) as exc:
                    refusal = await self._judged(exc, route, started)
        finally:  # the body has gone upstream, or never will: its bytes are free before any answer
            admission.release(token, self.held)
            admission.received -= self.received
            self.held = self.received = 0
        if refusal is not None:
            return await self._refuse(route, refusal)
        try:
            return await self._answer_from(reply, route)
        finally:
            await reply.aclose()

    async def _body(self, token: str, declared: int | None) -> list[bytes] | Refusal:
        """The whole body within the body timeout, held within the byte bounds: a declared
        length at once, before any of it is read, a chunked body as it comes."""
        limits, admission = self.limits, self.server.admission
        if declared is not None and declared > limits.max_request_bytes:
            return Refusal(Blame.OWN, "body_too_large", f"request body over {limits.max_request_bytes} bytes")
        if declared and (refusal := admission.hold(token, declared)) is not None:
            return refusal
        self.held = declared or 0
        if self.http.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(limits.body_timeout_sec):
                while True:
                    event = await self._next_event()
                    if isinstance(event, h11.EndOfMessage):
                        return chunks
                    if not isinstance(event, h11.Data):  # the sandbox closed before its body ended
                        raise ConnectionError("closed mid-body")
                    size += len(event.data)
                    if declared is None:
                        if size > limits.max_request_bytes:
                            return Refusal(
                                Blame.OWN, "body_too_large", f"request body over {limits.max_request_bytes} bytes"
                            )
                        if (refusal := admission.hold(token, len(event.data))) is not None:
                            return refusal
                        self.held += len(event.data)
                    chunks.append(event.data)
                    self.received += len(event.data)
                    admission.received += len(event.data)
        except TimeoutError:
            timeout = limits.body_timeout_sec
            return Refusal(Blame.OWN, "body_timeout", f"the request body did not arrive within {timeout:g} s")

    async def _answer_from(self, reply: httpcore.Response, route: RelayRoute) -> bool:
        """Stream the upstream's answer back (raw: its own content-encoding is passed on), cut
        off with the connection once over the response bound."""
        headers = [(k, v) for k, v in reply.headers if k.lower() not in _HOP_BY_HOP]
        route.record.answered()  # the policy answered: before any of it goes out, so whoever saw it sees this
        self.server.reachability.answered(route.origin)
        started = time.monotonic()
        await self._send(h11.Response(status_code=reply.status, headers=headers))
        limit, size = self.limits.max_response_bytes, 0
        try:
            async for chunk in reply.aiter_stream():
                size += len(chunk)
                if size > limit:
                    log.warning("policy relay: a response from %s passed %d bytes; cut off", route.origin, limit)
                    route.record.refused(Refusal(Blame.OWN, "response_too_large", f"response over {limit} bytes"))
                    return False
                await self._send(h11.Data(data=chunk))
        except (httpcore.TimeoutException, *UPSTREAM_ERRORS) as exc:
            judged = await self._judged(exc, route, started)
            kind = "upstream_broke_off" if judged.blame is Blame.INFRA else "answer_broken_off"
            route.record.refused(Refusal(judged.blame, kind, f"its answer broke off ({exc!r}): {judged.reason}"))
            return False
        await self._send(h11.EndOfMessage())
        return True

    async def _judged(self, exc: Exception, route: RelayRoute, started: float) -> Refusal:
        return await self.server.reachability.judge(exc, route.origin, route.host, route.prefix, started)

    async def _refuse(self, route: RelayRoute, refusal: Refusal) -> bool:
        """Answer ``refusal`` and close: the request's body may be unread."""
        route.record.refused(refusal)
        await self._answer(_STATUS.get(refusal.kind, _STATUS_OF[refusal.blame]), refusal.reason)
        return False

    async def _answer(self, status: int, text: str) -> None:
        """A short plain-text answer, after which the connection closes."""
        if self.answering or self.http.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = f"{text}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self._send(h11.Response(status_code=status, headers=headers))
        await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())
        if self.http.their_state is h11.SEND_BODY:
            await self._linger()

    async def _linger(self) -> None:
        """Let the sandbox read an answer it got while still sending its body: stop writing,
        then discard what it sends for a moment (closing on unread data would reset the
        connection, and the answer with it)."""
        try:
            async with asyncio.timeout(_LINGER_SEC):
                await self.writer.drain()
                self.writer.write_eof()
                while await self.reader.read(_READ_BYTES):
                    pass
        except (TimeoutError, OSError):
            pass

    def answer_stopped(self) -> None:
        """The relay stops: a call not yet answered gets a 503 now (written, not waited for)."""
        if self.answering or self.http.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            body = b"the policy relay stopped\n"
            headers = [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
            for event in (h11.Response(status_code=503, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                self.writer.write(self.http.send(event) or b"")
        except (h11.LocalProtocolError, ConnectionError, RuntimeError):
            pass

    async def _send(self, event: h11.Event) -> None:
        if isinstance(event, h11.Response):
            self.answering = True
        self.writer.write(self.http.send(event) or b"")
        if self.writer.transport.get_write_buffer_size() > _DRAIN_ABOVE:
            async with asyncio.timeout(self.limits.body_timeout_sec):  # a sandbox that stops reading is dropped
                await self.writer.drain()


_STATUS = {
    BODY_NOT_JSON: 400,
    "body_too_large": 413,
    "body_timeout": 408,
    "call_unsendable": 400,
    "call_timeout": 504,
    "call_dropped": 502,
    "upstream_timeout": 504,
    "upstream_unreachable": 502,
}


def _token(request: h11.Request) -> str:
    return request.target.decode("latin-1").lstrip("/").partition("/")[0].partition("?")[0]


def _content_length(request: h11.Request) -> int | None:
    """The declared body length (h11 has checked it is one well-formed number), None if chunked."""
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)
    return None
