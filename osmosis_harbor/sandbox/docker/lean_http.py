"""The engine's plain JSON requests over ``http.client``, each thread keeping its connection.

Why: docker-py sends every request through ``requests`` and ``urllib3`` (sessions, adapters,
pools, hooks, header merges, URL parsing), about 1.6 ms of client CPU per request here against
0.4-0.5 ms for the same request over ``http.client`` on the same Unix socket. A graded rollout
makes a dozen plain requests (container create, start and remove for two sandboxes; exec create
and inspect for three commands), and the client is the largest single share of a rollout's host
CPU that is ours to cut (issue 17).

What changes and what does not: only the transport of requests that read their whole answer
(``stream`` unset). The answer comes back as a real ``requests.Response``, so docker-py parses it
and raises its own errors from it exactly as before (``NotFound``, ``Conflict``, ``APIError``
with the engine's message); a failure to connect or a dropped connection is
``requests.exceptions.ConnectionError``, a read past the timeout ``requests.exceptions.ReadTimeout``,
as ``requests`` would raise them. Streams (exec output, attaches, archives read in chunks) keep
docker-py's own path. As with docker-py's pool, a request is never sent twice: a kept connection
the engine has closed is found before the request is written (the socket reads as ready), and a
new one is made. ``OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT=0`` keeps docker-py's transport for all.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.models import RequestEncodingMixin
from requests.structures import CaseInsensitiveDict

from osmosis_harbor import settings
from osmosis_harbor.sandbox.docker.transport import SOCKET_BASE, unix_adapter

__all__ = ["install_lean_requests"]


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
    """``requests.Session.request`` for one docker-py client, for the requests that need no stream."""

    def __init__(self, session_request: Callable[..., Any], socket_path: str, headers: Mapping[str, str]) -> None:
        self._fallback = session_request
        self._socket_path = socket_path
        self._headers = dict(headers)
        self._local = threading.local()

    def __call__(self, method: str, url: str, **kwargs: Any) -> Any:
        if not self._handles(url, kwargs):
            return self._fallback(method, url, **kwargs)
        return self._send(method.upper(), url, kwargs)

    @staticmethod
    def _handles(url: str, kwargs: Mapping[str, Any]) -> bool:
        known = {"params", "data", "json", "headers", "timeout", "stream", "allow_redirects"}
        return (
            url.startswith(SOCKET_BASE + "/")
            and not kwargs.get("stream")
            and kwargs.get("json") is None  # docker-py sends JSON as data
            and set(kwargs) <= known
            and (kwargs.get("data") is None or isinstance(kwargs["data"], str | bytes))
            and (kwargs.get("timeout") is None or isinstance(kwargs["timeout"], int | float))
        )

    def _send(self, method: str, url: str, kwargs: Mapping[str, Any]) -> requests.Response:
        parts = urlsplit(url)
        target = parts.path
        query = "&".join(filter(None, [parts.query, RequestEncodingMixin._encode_params(kwargs.get("params") or {})]))
        if query:
            target = f"{target}?{query}"
        headers = {**self._headers, **(kwargs.get("headers") or {})}
        body = kwargs.get("data")
        if isinstance(body, str):
            body = body.encode()  # as urllib3 sends a str body (http.client would use latin-1)
        timeout = kwargs.get("timeout")
        connection = self._connection(timeout)
        try:
            connection.request(method, target, body=body, headers=headers)
            answer = connection.getresponse()
            content = answer.read()
        except TimeoutError as exc:
            connection.close()
            raise requests.exceptions.ReadTimeout(f"{method} {target}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise requests.exceptions.ConnectionError(f"{method} {target}: {exc!r}") from exc
        if answer.will_close:
            connection.close()
        return _response(url, answer, content)

    def _connection(self, timeout: Any) -> _UnixConnection:
        """This thread's connection, made again when the engine closed the kept one."""
        seconds = None if timeout is None else float(timeout)
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


def _dropped(sock: socket.socket) -> bool:
    """An idle kept connection that reads as ready was closed by the engine (or holds bytes no
    request asked for): either way it must not carry the next request."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _response(url: str, answer: http.client.HTTPResponse, content: bytes) -> requests.Response:
    """The answer as ``requests`` would have built it, for docker-py's parsing and errors."""
    response = requests.Response()
    response.status_code = answer.status
    response.reason = answer.reason
    response.headers = CaseInsensitiveDict(answer.getheaders())
    response.url = url
    response._content = content
    response._content_consumed = True
    response.encoding = requests.utils.get_encoding_from_headers(response.headers)
    return response


def install_lean_requests(api: Any) -> bool:
    """Send ``api``'s (a ``docker.APIClient`` on a Unix socket) non-streaming requests through
    ``LeanRequests``; returns whether it applied (not for TCP, SSH, or when switched off)."""
    if not settings.current().lean_engine_client:
        return False
    adapter = unix_adapter(api)
    if adapter is None:
        return False
    # requests' defaults ask for gzip, which only requests would decode: the engine is asked for none
    headers = {"User-Agent": api.headers.get("User-Agent", "docker-sdk-python"), "Accept-Encoding": "identity"}
    api.request = LeanRequests(api.request, adapter.socket_path, headers)
    return True
