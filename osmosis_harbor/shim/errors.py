"""Failure vocabulary: shim-specific exceptions, categorization, secret scrubbing.

Categories follow ``LocalBackend`` exactly (``osmosis_ai``'s
``categorize_exception``: TimeoutError -> timeout; ValueError, TypeError,
AssertionError and pydantic's ValidationError -> validation_error; anything
else -> agent_error). The shim's own exceptions carry an explicit category for
the cases LocalBackend never meets because it validates them earlier, e.g. an
import path that does not resolve (an ``ImportError`` would otherwise read as
an agent bug).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

from osmosis_ai.rollout.types import RolloutErrorCategory
from osmosis_ai.rollout.utils.errors import categorize_exception

from .contract import KEY_ENV, environ
from .models import ErrorFile, Phase

# Shorter "keys" are placeholders ("EMPTY", "dummy") that local OpenAI-style
# servers accept; scrubbing them would shred ordinary words in the sample.
MIN_SECRET_LENGTH = 8
REDACTED = "***"


class ShimError(Exception):
    """Base for failures the shim detects itself; carries its own category."""

    category: ClassVar[RolloutErrorCategory] = RolloutErrorCategory.INTERNAL_ERROR


class InputError(ShimError):
    """A file or variable the host must stage is missing or malformed (host bug)."""

    category = RolloutErrorCategory.INTERNAL_ERROR


class LoadError(ShimError, ValueError):
    """The bundle's ``module:attr`` path does not resolve to the right kind of object."""

    category = RolloutErrorCategory.VALIDATION_ERROR


class NoSampleError(ShimError, ValueError):
    """The workflow finished without producing a sample (nothing to grade)."""

    category = RolloutErrorCategory.VALIDATION_ERROR


class AgentSampleError(ShimError, ValueError):
    """The verifier found no usable ``agent/sample.json``."""

    category = RolloutErrorCategory.VALIDATION_ERROR


class DeadlineExceeded(Exception):
    """Internal wrapper: *original* failed after the phase deadline had fired.

    LocalBackend reports such a failure with the original exception's
    category but with the deadline's message (user code may raise its own
    ``TimeoutError`` with a more useful text when the deadline did *not*
    fire). Wrapping keeps both pieces until the error file is written.
    """

    def __init__(self, message: str, original: BaseException) -> None:
        super().__init__(message)
        self.message = message
        self.original = original


def categorize(exc: BaseException) -> RolloutErrorCategory:
    """LocalBackend's categorization, extended with the shim's own failures."""
    if isinstance(exc, DeadlineExceeded):
        return categorize(exc.original)
    if isinstance(exc, ShimError):
        return exc.category
    return categorize_exception(exc)


@dataclass(frozen=True)
class Redactor:
    """Removes the API key (and its JSON/URL-escaped spellings) from output.

    Applied to every string the shim writes -- files and log lines alike --
    so a key echoed into an exception message, a traceback or even a message
    of the sample never reaches ``/logs``, which Harbor copies to the host.
    """

    secrets: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Redactor:
        return cls.for_key(environ(env).get(KEY_ENV))

    @classmethod
    def for_key(cls, key: str | None) -> Redactor:
        """The redactor of one key (the host scrubs retained trial files with the same rules)."""
        key = key or ""
        if len(key) < MIN_SECRET_LENGTH:
            return cls()
        variants = {key, json.dumps(key)[1:-1], quote(key, safe="")}
        # Longest first, so a variant containing another is replaced whole.
        return cls(tuple(sorted(variants, key=len, reverse=True)))

    def text(self, value: str) -> str:
        for secret in self.secrets:
            value = value.replace(secret, REDACTED)
        return value

    def data(self, value: Any) -> Any:
        """Scrub every string (keys included) of a JSON-ready structure.

        Scrubbing the structure rather than the encoded text keeps the JSON
        valid whatever characters the key contains.
        """
        if not self.secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value


def encodable(text: str) -> str:
    """``text`` with what UTF-8 cannot hold (lone surrogates, as in ``RuntimeError("\\ud800")``)
    spelled as its escape: the error file stays a file every reader can decode, and the
    workflow's failure stays its own rather than a crash of whoever writes its words next."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_file(phase: Phase, exc: BaseException, redactor: Redactor) -> ErrorFile:
    """Describe *exc* for ``<phase>/error.json``, with the key scrubbed."""
    original = exc.original if isinstance(exc, DeadlineExceeded) else exc
    message = exc.message if isinstance(exc, DeadlineExceeded) else str(exc)
    trace = "".join(traceback.format_exception(original))
    return ErrorFile(
        phase=phase,
        type=encodable(type(original).__name__),
        message=encodable(redactor.text(message)),
        category=categorize(exc),
        traceback=encodable(redactor.text(trace)),
    )
