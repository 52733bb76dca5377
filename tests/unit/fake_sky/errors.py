"""The fake's errors, shaped as SkyPilot's API answers them: an HTTP status on the exception.

``osmosis_harbor.sandbox.sdk.errors`` reads an SDK's exception by its ``status_code`` first, so
these mean to the product exactly what the same statuses mean from SkyPilot (and from the
skypilot-emulator, whose statuses they copy). `CannotAnswer` is the fake's own: a command it
cannot run honestly; it is never a status, so nothing in the product mistakes it for an answer.
"""

from __future__ import annotations

__all__ = [
    "CannotAnswer",
    "Conflict",
    "FakeSkyError",
    "InvalidRequest",
    "NotFound",
    "NotSupported",
    "ServerError",
    "Unavailable",
]


class FakeSkyError(Exception):
    """An API error of the fake SDK; ``status_code`` is what SkyPilot's API would answer."""

    status_code = 500


class InvalidRequest(FakeSkyError):
    """A request SkyPilot refuses: a bad name, an exec timeout over the cap, image with pool."""

    status_code = 400


class NotFound(FakeSkyError):
    """No such sandbox (terminated, lost), pool or file."""

    status_code = 404


class Conflict(FakeSkyError):
    """The name is taken (a sandbox, a pool), or a pool has no ready member for a claim."""

    status_code = 409


class ServerError(FakeSkyError):
    """The API server failed the call (``delete_pool`` of a pool with a claimed member)."""

    status_code = 500


class NotSupported(FakeSkyError):
    """A documented SkyPilot option the fake does not implement (ports, volumes, ...)."""

    status_code = 501


class Unavailable(FakeSkyError):
    """The API server said "not now": a fault injected on request (`Faults.fail`)."""

    status_code = 503


class CannotAnswer(RuntimeError):
    """A command, or a piece of shell syntax, the fake cannot run honestly (see the package
    docstring for what it can). Raised from ``exec``: a test that meets it must not pass."""
