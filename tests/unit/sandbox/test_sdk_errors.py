"""An SDK's exception is read the same whatever its shape (``sandbox/sdk/errors.py``): the Docker
SDK's builtin families, and SkyPilot's (a ``RuntimeError`` with the HTTP status, on the error or
its response, or one of ``sky.exceptions``' documented names), including the real classes of
both SDKs here."""

from __future__ import annotations

import httpx
import pytest

from osmosis_harbor import errors as docker_errors
from osmosis_harbor.sandbox import emulator as sky
from osmosis_harbor.sandbox.sdk.errors import Meaning, is_api_fault, meaning


def _skypilot_status(status: int) -> RuntimeError:
    class SandboxError(RuntimeError):  # a class of unknown name, as SkyPilot's SDK may raise
        status_code = status

    return SandboxError(f"HTTP {status}")


def _http_status_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/sandboxes")
    return httpx.HTTPStatusError("refused", request=request, response=httpx.Response(status, request=request))


def _documented(name: str) -> RuntimeError:
    return type(name, (RuntimeError,), {})("no status")  # sky.exceptions' classes carry none


SHAPES: dict[Meaning, list[BaseException]] = {
    Meaning.FAULT: [
        ConnectionResetError("reset"),
        TimeoutError("hang"),
        _skypilot_status(503),
        _skypilot_status(429),
        _skypilot_status(500),
        _http_status_error(502),
        _documented("ApiServerConnectionError"),
        _documented("ServerTemporarilyUnavailableError"),
        _documented("RequestInterruptedError"),
        sky.ApiUnavailableError("503"),
        sky.ApiConnectionError("reset"),
        sky.ApiTimeoutError("hang"),
        sky.PoolInUseError("delete_pool with a claimed member"),
    ],
    Meaning.MISSING: [
        FileNotFoundError("/x"),
        docker_errors.SandboxNotFoundError("gone"),
        docker_errors.PoolNotFoundError("no pool"),
        _skypilot_status(404),
        _http_status_error(404),
        sky.SandboxNotFoundError("gone"),
        sky.PoolNotFoundError("no pool"),
        sky.RemoteFileNotFoundError("/x"),
    ],
    Meaning.INVALID: [
        ValueError("bad name"),
        IsADirectoryError("/etc"),
        docker_errors.PoolExistsError("another shape"),
        _skypilot_status(400),
        _http_status_error(422),
        sky.InvalidRequestError("bad name"),
        sky.RemoteIsADirectoryError("/etc"),
        sky.NotSupportedError("ports"),  # 501: refused, not a fault to retry
    ],
    Meaning.CONFLICT: [_skypilot_status(409), sky.PoolExistsError("twice"), sky.PoolExhaustedError("empty")],
    Meaning.OTHER: [RuntimeError("?"), docker_errors.PoolExhaustedError("empty"), sky.PoolWarmTimeoutError("warming")],
}


@pytest.mark.parametrize(
    ("expected", "exc"),
    [(m, e) for m, shapes in SHAPES.items() for e in shapes],
    ids=lambda v: v.value if isinstance(v, Meaning) else type(v).__name__,
)
def test_each_shape_means_what_it_says(expected: Meaning, exc: BaseException) -> None:
    assert meaning(exc) is expected


def test_a_status_outranks_the_builtin_family() -> None:
    """A class that is both (say a LookupError with a 503) is read by what the server answered."""

    class Odd(LookupError):
        status_code = 503

    assert is_api_fault(Odd("busy")) and meaning(LookupError("plain")) is Meaning.MISSING


def test_the_emulator_raises_none_of_the_builtins_our_code_must_not_rely_on() -> None:
    builtins = (ValueError, LookupError, FileNotFoundError, IsADirectoryError, ConnectionError, TimeoutError)
    for name in sky.__all__:
        cls = getattr(sky, name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            assert issubclass(cls, RuntimeError) and not issubclass(cls, builtins), name
