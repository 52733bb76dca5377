"""The client's HTTP session with the emulator server, and how answers become results or errors.

Like SkyPilot's SDK, one shared session per process (``aclose()`` releases it), and transient
refusals are retried inside the SDK before they surface: a 503 or a 429 (the server did nothing;
``Retry-After`` is honoured) and a connection that could not be made (nothing was sent), within
``Settings.emulator_retries``. A reset or a timeout *during* a call is surfaced at once as
`ApiConnectionError` / `ApiTimeoutError` (both SkyPilot's ``ApiServerConnectionError``): the
call may have run, and only the caller knows whether repeating it is safe.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from osmosis_harbor import settings
from osmosis_harbor.sandbox.emulator.errors import (
    ApiConnectionError,
    ApiTimeoutError,
    RateLimitError,
    error_for,
)
from osmosis_harbor.sandbox.emulator.server import launcher

__all__ = ["Session", "session"]


class _Transient(Exception):
    """A refusal the SDK retries by itself (503, 429, connection not made)."""

    def __init__(self, error: Exception, retry_after: float | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, _Transient) and exc.retry_after is not None:
        return exc.retry_after
    return wait_exponential(multiplier=0.1, max=5.0)(state)


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def _refusal(response: httpx.Response) -> Exception:
    try:
        body = response.json()["error"]
        kind, message = str(body["kind"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "server_error", f"HTTP {response.status_code}: {response.text[:200]}"
    if kind == "rate_limited":
        return RateLimitError(message, _retry_after(response))
    return error_for(kind, message)


class Session:
    """One HTTP session with the emulator server (thread-safe; blocking calls run on threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._url: str | None = None

    def _http(self, current: settings.Settings) -> tuple[httpx.Client, str]:
        with self._lock:
            if self._client is None or self._url is None:
                self._url = launcher.server_url(current)
                self._client = httpx.Client(base_url=self._url)  # every request names its own timeout (call)
            return self._client, self._url

    def _forget_server(self, failed: httpx.Client) -> None:
        """The server could not be reached: find (or start) one again on the next attempt.

        The old client is dropped, not closed: other threads may still be mid-call on it."""
        with self._lock:
            if self._client is failed:
                self._client, self._url = None, None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client, self._url = None, None

    def call(
        self, method: str, path: str, *, extra_timeout: float = 0.0, timeout: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        """One API call, with the SDK's own retries of transient refusals. It fails after
        ``timeout`` seconds, else after the setting's plus ``extra_timeout``. The settings are read
        here, once per call (the client's one reading of them, as SkyPilot's SDK reads its config
        per call), and carried to its attempts."""
        current = settings.current()
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, _Transient)),
            stop=stop_after_attempt(current.emulator_retries + 1),
            wait=_wait,
            reraise=True,
        )
        try:
            limit = timeout if timeout is not None else current.emulator_timeout + extra_timeout
            return retrying(self._once, current, method, path, limit, kwargs)
        except _Transient as exc:
            raise exc.error from None

    def _once(
        self, current: settings.Settings, method: str, path: str, timeout: float, kwargs: dict[str, Any]
    ) -> httpx.Response:
        client, url = self._http(current)
        try:
            response = client.request(method, path, timeout=timeout, **kwargs)
        except httpx.ConnectError as exc:
            self._forget_server(client)
            raise _Transient(ApiConnectionError(f"cannot connect to the sandbox API at {url}: {exc}"), None) from exc
        except httpx.TimeoutException as exc:
            raise ApiTimeoutError(f"{method} {path}: the sandbox API at {url} did not answer in {timeout:g}s") from exc
        except httpx.TransportError as exc:
            raise ApiConnectionError(
                f"{method} {path}: connection to the sandbox API at {url} failed: {exc!r}"
            ) from exc
        if response.status_code < 400:
            return response
        error = _refusal(response)
        if response.status_code in (429, 503):
            raise _Transient(error, _retry_after(response))
        raise error


_SESSION = Session()


def session() -> Session:
    """The process's shared session (SkyPilot's SDK keeps one too)."""
    return _SESSION
