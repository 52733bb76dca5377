"""The engine's requests over ``http.client``: plain ones on a kept connection per thread, an
exec's output and archive reads on a connection of their own.

Why: docker-py sends every request through ``requests`` and ``urllib3`` (sessions, adapters,
pools, hooks, header merges, URL parsing), about 1.6 ms of client CPU per request here against
0.4-0.5 ms for the same request over ``http.client`` on the same Unix socket. A graded rollout
makes a dozen plain requests (container create, start and remove for two sandboxes; exec create
and inspect for three commands), and the client is the largest single share of a rollout's host
CPU that is ours to cut.

What changes and what does not: only the transport. The answer comes back as a real
``requests.Response``, so docker-py parses it and raises its own errors from it as over ``requests``
(``NotFound``, ``Conflict``, ``APIError`` with the engine's message); a failure to connect or a
dropped connection is ``requests.exceptions.ConnectionError``, a read past the timeout
``requests.exceptions.ReadTimeout``, as ``requests`` would raise them. As with docker-py's pool,
a request is never sent twice: a kept connection the engine has closed is found before the
request is written (the socket reads as ready), and a new one is made.

Two streams, an exec's output and an archive read in chunks, go the same way on a connection
of their own, closed with the response (other streams keep docker-py's path). The response's
``raw`` is shaped as docker-py reaches into urllib3's (``raw._fp.fp.raw`` is the socket's
reader, which docker-py hands to its frame reader for an exec's hijacked output), and a body
that breaks off mid-read raises what ``requests`` raises then (``ChunkedEncodingError``, or
``ConnectionError`` for a timeout). Asking the engine for no compression also spares both
sides gzip on archives (``requests`` asks for gzip, which the engine applies to archives).
``OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT=0`` keeps docker-py's transport for all (read with the Docker
SDK's other settings, ``DockerConfig.lean_engine_client``).
"""

from __future__ import annotations

import http.client
import re
import select
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.models import RequestEncodingMixin
from requests.structures import CaseInsensitiveDict

from osmosis_harbor.sandbox.docker.transport import SOCKET_BASE, unix_adapter

__all__ = ["install_lean_requests"]


# The streams this transport carries: an exec's output and an archive read in chunks. Other
# streams (pulls, builds, logs, events) are read by docker-py helpers that reach further into
# urllib3's objects, so they keep docker-py's path.
_STREAMED = re.compile(r"^/v[0-9.]+/(exec/[^/]+/start|containers/[^/]+/archive)$")


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 on the engine's Unix socket (kept alive between requests by default)."""

    def __init__(self, socket_path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class LeanRequests:
    """``requests.Session.request`` for one docker-py client on the engine's Unix socket."""

    def __init__(self, session_request: Callable[..., Any], socket_path: str, headers: Mapping[str, str]) -> None:
        self._fallback = session_request
        self._socket_path = socket_path
        self._headers = dict(headers)
        self._local = threading.local()

    def __call__(self, method: str, url: str, **kwargs: Any) -> Any:
        if not self._handles(url, kwargs):
            return self._fallback(method, url, **kwargs)
        if kwargs.get("stream"):
            return self._send_stream(method.upper(), url, kwargs)
        return self._send(method.upper(), url, kwargs)

    @staticmethod
    def _handles(url: str, kwargs: Mapping[str, Any]) -> bool:
        known = {"params", "data", "json", "headers", "timeout", "stream", "allow_redirects"}
        return (
            url.startswith(SOCKET_BASE + "/")
            and (not kwargs.get("stream") or _STREAMED.search(urlsplit(url).path) is not None)
            and kwargs.get("json") is None  # docker-py sends JSON as data
            and set(kwargs) <= known
            and (kwargs.get("data") is None or isinstance(kwargs["data"], str | bytes))
            and (kwargs.get("timeout") is None or isinstance(kwargs["timeout"], int | float))
        )

    def _request_parts(self, url: str, kwargs: Mapping[str, Any]) -> tuple[str, dict[str, str], bytes | None]:
        """(request target, headers, body) as ``requests`` would send them."""
        parts = urlsplit(url)
        target = parts.path
        query = "&".join(filter(None, [parts.query, RequestEncodingMixin._encode_params(kwargs.get("params") or {})]))
        if query:
            target = f"{target}?{query}"
        headers = {**self._headers, **(kwargs.get("headers") or {})}
        body = kwargs.get("data")
        if isinstance(body, str):
            body = body.encode()  # as urllib3 sends a str body (http.client would use latin-1)
        return target, headers, body

    def _send(self, method: str, url: str, kwargs: Mapping[str, Any]) -> requests.Response:
        target, headers, body = self._request_parts(url, kwargs)
        connection = self._connection(kwargs.get("timeout"))
        answer, content = _exchange(connection, method, target, headers, body, read=True)
        if answer.will_close:
            connection.close()
        return _response(url, answer, content)

    def _send_stream(self, method: str, url: str, kwargs: Mapping[str, Any]) -> requests.Response:
        """The request on a connection of its own, its body left to be read: the connection
        closes with the response (a hijacked exec output can never carry another request)."""
        target, headers, body = self._request_parts(url, kwargs)
        connection = _UnixConnection(self._socket_path, _seconds(kwargs.get("timeout")))
        answer, _ = _exchange(connection, method, target, headers, body, read=False)
        response = _response(url, answer, None)
        response.raw = _StreamedBody(answer, connection, f"{method} {target}")
        return response

    def _connection(self, timeout: int | float | None) -> _UnixConnection:
        """This thread's connection, made again when the engine closed the kept one."""
        seconds = _seconds(timeout)
        connection: _UnixConnection | None = getattr(self._local, "connection", None)
        if connection is not None and connection.sock is not None and _dropped(connection.sock):
            connection.close()
        if connection is None:
            connection = _UnixConnection(self._socket_path, seconds)
            self._local.connection = connection
        connection.timeout = seconds
        if connection.sock is not None:
            connection.sock.settimeout(seconds)
        return connection


def _seconds(timeout: int | float | None) -> float | None:
    """A request's ``timeout`` (docker-py passes a number or None) as the socket takes it."""
    return None if timeout is None else float(timeout)


def _exchange(
    connection: _UnixConnection, method: str, target: str, headers: Mapping[str, str], body: bytes | None, *, read: bool
) -> tuple[http.client.HTTPResponse, bytes | None]:
    """Send the request and take the answer's head (and its body when ``read``), failing as
    ``requests`` does: a timeout is ``ReadTimeout``, anything else on the way ``ConnectionError``."""
    try:
        connection.request(method, target, body=body, headers=headers)
        answer = connection.getresponse()
        return answer, answer.read() if read else None
    except TimeoutError as exc:
        connection.close()
        raise requests.exceptions.ReadTimeout(f"{method} {target}: {exc}") from exc
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise requests.exceptions.ConnectionError(f"{method} {target}: {exc!r}") from exc


def _dropped(sock: socket.socket) -> bool:
    """An idle kept connection that reads as ready was closed by the engine (or holds bytes no
    request asked for): either way it must not carry the next request."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class _StreamedBody:
    """A streamed answer's ``Response.raw``: what ``requests`` reads its body through
    (``read``, ``close``, ``release_conn``) and what docker-py reaches for to take over an
    exec's socket and to shut it (``_fp.fp.raw``, the reader of the socket under the HTTP
    answer, and ``closed``)."""

    def __init__(self, answer: http.client.HTTPResponse, connection: _UnixConnection, what: str) -> None:
        self._fp = answer
        self._connection = connection
        self._what = what

    def read(self, amount: int | None = None) -> bytes:
        try:
            chunk = self._fp.read(amount)
        except TimeoutError as exc:  # requests: a read timeout mid-body is a ConnectionError
            raise requests.exceptions.ConnectionError(f"{self._what}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:  # urllib3's ProtocolError, as requests wraps it
            raise requests.exceptions.ChunkedEncodingError(f"{self._what}: {exc!r}") from exc
        if not chunk and amount != 0 and self._fp.length:
            # http.client ends a body cut short quietly; urllib3 enforces Content-Length
            missing = http.client.IncompleteRead(b"", self._fp.length)
            raise requests.exceptions.ChunkedEncodingError(f"{self._what}: {missing!r}")
        return chunk

    @property
    def closed(self) -> bool:
        """As urllib3's: whether the answer's reader is gone (docker-py's ``CancellableStream``
        shuts the exec's socket down on ``close()`` unless it is)."""
        return self._fp.isclosed()

    def close(self) -> None:
        self._connection.close()  # closes the answer with it

    release_conn = close  # nothing to give back: the connection was this answer's alone


def _response(url: str, answer: http.client.HTTPResponse, content: bytes | None) -> requests.Response:
    """The answer as ``requests`` would have built it, for docker-py's parsing and errors
    (``content`` None: the body is still to be read, through ``raw``)."""
    response = requests.Response()
    response.status_code = answer.status
    response.reason = answer.reason
    response.headers = CaseInsensitiveDict(answer.getheaders())
    response.url = url
    if content is not None:
        response._content = content
        response._content_consumed = True
    response.encoding = requests.utils.get_encoding_from_headers(response.headers)
    return response


def install_lean_requests(api: Any, *, enabled: bool = True) -> bool:
    """Send ``api``'s (a ``docker.APIClient`` on a Unix socket) requests through ``LeanRequests``
    (plain ones, an exec's output and archive reads; other streams stay docker-py's); returns
    whether it applied (not for TCP, SSH, or when switched off)."""
    if not enabled:
        return False
    adapter = unix_adapter(api)
    if adapter is None:
        return False
    # requests' defaults ask for gzip, which only requests would decode: the engine is asked for none
    headers = {"User-Agent": api.headers.get("User-Agent", "docker-sdk-python"), "Accept-Encoding": "identity"}
    api.request = LeanRequests(api.request, adapter.socket_path, headers)
    return True
