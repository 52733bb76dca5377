"""What the skypilot-emulator SDK raises, shaped like what SkyPilot's SDK is known to raise.

SkyPilot's documentation names the failures (a name that is not DNS-1123, an image that cannot
be pulled, an API server that is unavailable or rate-limits, a sandbox or pool that does not
exist) but not the Sandbox SDK's exception classes. What is documented is core SkyPilot's API
errors (``sky/exceptions.py``): ``RuntimeError``-based, with ``ApiServerConnectionError`` for an
API server that cannot be reached; and its examples read HTTP statuses off the errors ("400 Bad
Request", "delete_pool 500s"). So every class here is a ``RuntimeError`` and carries the
``status_code`` of the server's answer where there was one, and none of them is a builtin
``ValueError``, ``LookupError``, ``FileNotFoundError``, ``ConnectionError`` or ``TimeoutError``:
code that only works by catching those would break on SkyPilot, and here it breaks first. A
connection that broke, or a call that was not answered in time, has no status: it is an
``ApiServerConnectionError`` (sky's name), so a reader of documented names sees a fault.

The server answers every refusal as ``{"error": {"kind": ..., "message": ...}}``; `KINDS` maps
the kind back to its class on the client.
"""

from __future__ import annotations

from osmosis_harbor.errors import SandboxError

__all__ = [
    "KINDS",
    "ApiConnectionError",
    "ApiServerConnectionError",
    "ApiServerError",
    "ApiTimeoutError",
    "ApiUnavailableError",
    "EmulatorStartError",
    "ImagePullError",
    "InvalidRequestError",
    "NotSupportedError",
    "PoolExhaustedError",
    "PoolExistsError",
    "PoolInUseError",
    "PoolNotFoundError",
    "PoolWarmTimeoutError",
    "RateLimitError",
    "RemoteFileNotFoundError",
    "RemoteIsADirectoryError",
    "SandboxApiError",
    "SandboxExistsError",
    "SandboxNotFoundError",
    "error_for",
]


class SandboxApiError(SandboxError, RuntimeError):
    """A call the Sandbox API server refused or could not answer (its HTTP status, if any)."""

    status_code: int | None = None


class InvalidRequestError(SandboxApiError):
    """A request SkyPilot refuses: a bad name, an exec timeout over the cap, image with pool, ..."""

    status_code = 400


class NotSupportedError(SandboxApiError):
    """A documented SkyPilot option the emulator does not implement (ports, volumes, enable_docker)."""

    status_code = 501


class ImagePullError(SandboxApiError):
    """The image reference cannot be pulled from its registry (SkyPilot's ErrImagePull)."""

    status_code = 424


class SandboxNotFoundError(SandboxApiError):
    status_code = 404


class PoolNotFoundError(SandboxApiError):
    status_code = 404


class RemoteFileNotFoundError(SandboxApiError):
    """``read_bytes`` of a path that does not exist, or a write into a directory that does not."""

    status_code = 404


class RemoteIsADirectoryError(SandboxApiError):
    """``read_bytes`` of a directory."""

    status_code = 400


class SandboxExistsError(SandboxApiError):
    status_code = 409


class PoolExistsError(SandboxApiError):
    """``create_pool`` of a name that exists (SkyPilot's examples read it as "already exists")."""

    status_code = 409


class PoolExhaustedError(SandboxApiError):
    """A claim from a pool with no ready member (slime: "the pool hasn't warmed a ready box yet")."""

    status_code = 409


class PoolWarmTimeoutError(SandboxApiError):
    """``create_pool`` / ``set_pool_size`` returned before the pool was fully warm (the SDK's own
    timeout, so no HTTP status): the pool exists and keeps warming."""


class ApiUnavailableError(SandboxApiError):
    """The API server answered 503 after the SDK's retry budget was spent."""

    status_code = 503


class RateLimitError(SandboxApiError):
    """The API server answered 429 after the SDK's retry budget was spent."""

    status_code = 429

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ApiServerError(SandboxApiError):
    """The API server failed on its side (HTTP 500)."""

    status_code = 500


class PoolInUseError(ApiServerError):
    """``delete_pool`` while sandboxes claimed from the pool still exist (SkyPilot answers 500)."""


class ApiServerConnectionError(SandboxApiError):
    """The API server could not be reached, or the connection broke (sky.exceptions' name)."""


class ApiConnectionError(ApiServerConnectionError):
    """The connection was reset mid-call: the call may or may not have run."""


class ApiTimeoutError(ApiServerConnectionError):
    """The API server did not answer in time: the call may or may not have run."""


class EmulatorStartError(SandboxApiError):
    """An on-demand skypilot-emulator server did not come up (its log file says why)."""


KINDS: dict[str, type[SandboxApiError]] = {
    "invalid_request": InvalidRequestError,
    "not_supported": NotSupportedError,
    "image_pull": ImagePullError,
    "sandbox_not_found": SandboxNotFoundError,
    "pool_not_found": PoolNotFoundError,
    "sandbox_exists": SandboxExistsError,
    "pool_exists": PoolExistsError,
    "pool_exhausted": PoolExhaustedError,
    "pool_in_use": PoolInUseError,
    "file_not_found": RemoteFileNotFoundError,
    "is_a_directory": RemoteIsADirectoryError,
    "unavailable": ApiUnavailableError,
    "rate_limited": RateLimitError,
    "server_error": ApiServerError,
}


def error_for(kind: str, message: str) -> SandboxApiError:
    """The exception the client raises for a server's refusal of ``kind``."""
    return KINDS.get(kind, ApiServerError)(message)
