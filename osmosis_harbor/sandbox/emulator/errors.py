"""What the skypilot-emulator SDK raises, mirroring the failures SkyPilot's Sandbox SDK reports.

SkyPilot's documentation names the failures (a name that is not DNS-1123, an image that cannot
be pulled, an API server that is unavailable or rate-limits, a sandbox or pool that does not
exist) but not its exception classes. Our assumption, stated in the README: each failure is one
class here, and each also subclasses the builtin that callers already catch (``ValueError`` for
a refused request, ``LookupError`` for something missing, ``ConnectionError`` / ``TimeoutError``
for transport failures), so code written against either SDK handles both the same way.

The server answers every refusal as ``{"error": {"kind": ..., "message": ...}}``; `KINDS` maps
the kind back to its class on the client.
"""

from __future__ import annotations

from osmosis_harbor.errors import (
    ImageNotFoundError,
    PoolExistsError,
    PoolNotFoundError,
    SandboxError,
    SandboxExistsError,
    SandboxNotFoundError,
)

__all__ = [
    "KINDS",
    "ApiConnectionError",
    "ApiServerError",
    "ApiTimeoutError",
    "ApiUnavailableError",
    "EmulatorStartError",
    "ImagePullError",
    "InvalidRequestError",
    "NotSupportedError",
    "PoolExistsError",
    "PoolNotFoundError",
    "RateLimitError",
    "RemoteFileNotFoundError",
    "RemoteIsADirectoryError",
    "SandboxApiError",
    "SandboxExistsError",
    "SandboxNotFoundError",
    "error_for",
]


class SandboxApiError(SandboxError):
    """A call the Sandbox API server refused or could not answer."""

    status_code: int | None = None


class InvalidRequestError(SandboxApiError, ValueError):
    """A request SkyPilot refuses: a bad name, an exec timeout over the cap, image with pool, ..."""

    status_code = 400


class NotSupportedError(SandboxApiError, NotImplementedError):
    """A documented SkyPilot option the emulator does not implement (ports, volumes, enable_docker)."""

    status_code = 501


class ImagePullError(SandboxApiError, ImageNotFoundError):
    """The image reference cannot be pulled from its registry (SkyPilot's ErrImagePull)."""

    status_code = 424


class RemoteFileNotFoundError(SandboxApiError, FileNotFoundError):
    """``read_bytes`` of a path that does not exist in the sandbox."""

    status_code = 404


class RemoteIsADirectoryError(SandboxApiError, IsADirectoryError):
    """``read_bytes`` of a directory."""

    status_code = 400


class ApiUnavailableError(SandboxApiError, ConnectionError):
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


class ApiConnectionError(SandboxApiError, ConnectionError):
    """The connection to the API server failed or was reset; the call may or may not have run."""


class ApiTimeoutError(SandboxApiError, TimeoutError):
    """The API server did not answer in time; the call may or may not have run."""


class EmulatorStartError(SandboxApiError, RuntimeError):
    """An on-demand skypilot-emulator server did not come up (its log file says why)."""


KINDS: dict[str, type[Exception]] = {
    "invalid_request": InvalidRequestError,
    "not_supported": NotSupportedError,
    "image_pull": ImagePullError,
    "sandbox_not_found": SandboxNotFoundError,
    "pool_not_found": PoolNotFoundError,
    "sandbox_exists": SandboxExistsError,
    "pool_exists": PoolExistsError,
    "file_not_found": RemoteFileNotFoundError,
    "is_a_directory": RemoteIsADirectoryError,
    "unavailable": ApiUnavailableError,
    "rate_limited": RateLimitError,
    "server_error": ApiServerError,
}


def error_for(kind: str, message: str) -> Exception:
    """The exception the client raises for a server's refusal of ``kind``."""
    return KINDS.get(kind, ApiServerError)(message)
