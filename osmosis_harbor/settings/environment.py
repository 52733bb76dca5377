"""The one place this process's environment is read or written (``scripts/check_environ.py``
refuses ``os.environ`` and ``os.getenv`` anywhere else in the package but the shim).

``current()`` reflects the environment as it is at each call (a test or a caller that changes
a variable sees it at once); it builds the model only when the variables it reads changed,
because pydantic-settings' parse costs milliseconds. Nothing here is read, and nothing is
written, at import time.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from osmosis_harbor.settings.model import Settings

__all__ = [
    "child_environment",
    "current",
    "host_variable",
    "scoped_variable",
    "secret_values",
    "use_bundled_model_prices",
]

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_MIN_SECRET = 8
_FOREIGN_NAMES = frozenset(
    {
        "HARBOR_SKYPILOT_REGISTRY",
        "DOCKER_HOST",
        "XDG_CACHE_HOME",
        "COLUMNS",
        "_OSMOSIS_ROLLOUT_PORT",
        "SKYPILOT_API_SERVER_ENDPOINT",
    }
)
_PREFIX_BYTES = b"OSMOSIS_HARBOR_"
_FOREIGN_BYTES = frozenset(name.encode() for name in _FOREIGN_NAMES)


def current() -> Settings:
    """The settings as the environment says now (one parse per distinct set of values).

    Called dozens of times per rollout (every emulator API call reads its timeout), so the key
    is built from the environment's raw bytes where the platform keeps them (POSIX's
    ``os.environ._data``): no name is decoded, and only the part of the environment pydantic-
    settings reads (names matched case-insensitively) goes into the key."""
    raw = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(raw, dict):
        relevant_raw = tuple(
            sorted(
                (name, value)
                for name, value in raw.items()
                if (upper := name.upper()).startswith(_PREFIX_BYTES) or upper in _FOREIGN_BYTES
            )
        )
        return _parsed(relevant_raw)
    env = os.environ
    relevant = tuple(
        sorted(
            (name, env[name])
            for name in env
            if (upper := name.upper()).startswith("OSMOSIS_HARBOR_") or upper in _FOREIGN_NAMES
        )
    )
    return _parsed(relevant)


@functools.lru_cache(maxsize=16)
def _parsed(relevant: tuple[tuple[str, str], ...] | tuple[tuple[bytes, bytes], ...]) -> Settings:
    """``Settings()`` for this set of variables: the key is the part of the environment read."""
    return Settings()


def host_variable(name: str) -> str | None:
    """A variable the user named explicitly (a sandbox secret, ``--api-key-env``)."""
    return os.environ.get(name)


def secret_values() -> tuple[str, ...]:
    """Values of this host's secret-looking variables, longest first: output that may echo them
    (a sandbox's, a build's) is redacted of these before it is shown or kept."""
    values = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET}
    return tuple(sorted(values, key=len, reverse=True))


def child_environment(**overrides: str) -> dict[str, str]:
    """This process's environment plus ``overrides``, for a subprocess we start."""
    return {**os.environ, **overrides}


@contextmanager
def scoped_variable(name: str, value: str) -> Iterator[None]:
    """Set ``name`` for the block (another library reads it), then restore what was there."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def use_bundled_model_prices() -> None:
    """Make litellm use its bundled model-price map instead of downloading one when it is first
    imported (Harbor's agents import it; hosts without egress would wait on the download).

    Called by the entry points (the command line, ``HarborBackend``, ``validate_tasks``) before
    they import Harbor's agents, never at import time; a value the user set wins."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
