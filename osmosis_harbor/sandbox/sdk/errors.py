"""What an SDK's exception means: an API fault, "not found", "already exists", a refused request.

The two SDK shapes differ. Our Docker SDK raises builtin families (``LookupError`` for something
missing, ``ValueError`` for a refused request, ``ConnectionError`` / ``TimeoutError`` for the
transport). SkyPilot documents no Sandbox SDK exception classes; what it does document is core
SkyPilot's API errors (``sky/exceptions.py``: ``RuntimeError``-based, ``ApiServerConnectionError``
when the API server cannot be reached, ``ServerTemporarilyUnavailableError``,
``RequestInterruptedError``) and HTTP statuses, which its own examples read ("400 Bad Request",
"delete_pool 500s"). So an exception is read here by its HTTP status when it carries one
(``status_code``, or its ``response``'s), then by those documented names anywhere in its class
hierarchy, then by its builtin family; every caller asks this module, never ``isinstance`` on a
builtin, so both shapes mean the same thing (``tests/e2e/sandbox/test_api_faults.py`` raises each kind in
both shapes).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "DOCUMENTED_FAULT_NAMES",
    "TRANSIENT_STATUS",
    "Meaning",
    "is_api_fault",
    "is_invalid",
    "is_missing",
    "meaning",
    "status_of",
]

# HTTP statuses of a server that did not (or may not have) done the work: try again later.
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
# sky.exceptions' names for an API server that could not be reached or answered "not now".
DOCUMENTED_FAULT_NAMES = frozenset(
    {"ApiServerConnectionError", "ServerTemporarilyUnavailableError", "RequestInterruptedError"}
)


class Meaning(StrEnum):
    FAULT = "api fault"  # the call may or may not have run: retry where that is safe
    MISSING = "not found"  # an answer: the sandbox, pool or file is not there
    CONFLICT = "already exists"  # an answer: the name is taken
    INVALID = "refused"  # an answer: the request is wrong (or not supported)
    OTHER = "other"  # anything else (a refusal of unknown shape included)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (``.status_code``, or its ``.response``'s)."""
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def _by_status(status: int) -> Meaning:
    if status in TRANSIENT_STATUS:
        return Meaning.FAULT
    if status in (404, 410):
        return Meaning.MISSING
    if status == 409:
        return Meaning.CONFLICT
    if 400 <= status < 500 or status == 501:  # 501: not implemented, a refusal
        return Meaning.INVALID
    return Meaning.OTHER


def meaning(exc: BaseException) -> Meaning:
    """What ``exc`` says about the call that raised it (see the module docstring)."""
    status = status_of(exc)
    if status is not None:
        return _by_status(status)
    if any(cls.__name__ in DOCUMENTED_FAULT_NAMES for cls in type(exc).__mro__):
        return Meaning.FAULT
    if isinstance(exc, (FileNotFoundError, LookupError)):
        return Meaning.MISSING
    if isinstance(exc, (IsADirectoryError, NotADirectoryError, PermissionError, ValueError, NotImplementedError)):
        return Meaning.INVALID
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return Meaning.FAULT
    return Meaning.OTHER


def is_api_fault(exc: BaseException) -> bool:
    """A failure of the API, not an answer: a transport failure, a timeout, a transient status."""
    return meaning(exc) is Meaning.FAULT


def is_missing(exc: BaseException) -> bool:
    """The sandbox, pool or path is not there (404, ``LookupError``, ``FileNotFoundError``)."""
    return meaning(exc) is Meaning.MISSING


def is_invalid(exc: BaseException) -> bool:
    return meaning(exc) is Meaning.INVALID
