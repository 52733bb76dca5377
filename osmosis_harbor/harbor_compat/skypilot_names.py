"""Harbor's private constants and helper whose values our environment keeps, under public names.

Our environment matches Harbor's ``SkypilotEnvironment`` where it keeps its behaviour: the
sandbox TTL it asks for, the 3600 s exec cap, its DNS-safe sandbox names, its transfer dirs and
pack timeout. These are Harbor's own objects, read here and nowhere else: a Harbor release that
drops or renames one fails at this import, by name, and ``tests/unit/harbor_compat/test_surface.py`` checks
each entry's shape (``surface_elsewhere.py`` lists them)."""

from __future__ import annotations

from pathlib import PurePosixPath

from harbor.environments.base import _ENV_TRANSFER_TAR_DIR, _TRANSFER_PACK_TIMEOUT_SEC
from harbor.environments.skypilot import (
    _MAX_TIMEOUT_SEC,
    _REMOTE_TRANSFER_DIR,
    _SANDBOX_TTL_SEC,
    _sanitize_dns_name,
)

__all__ = [
    "ENV_TRANSFER_TAR_DIR",
    "MAX_EXEC_TIMEOUT_SEC",
    "REMOTE_TRANSFER_DIR",
    "SANDBOX_TTL_SEC",
    "TRANSFER_PACK_TIMEOUT_SEC",
    "sanitize_dns_name",
]

SANDBOX_TTL_SEC: int = _SANDBOX_TTL_SEC  # a sandbox's auto-reap lifetime, passed to every create
MAX_EXEC_TIMEOUT_SEC: int = _MAX_TIMEOUT_SEC  # SkyPilot's server-side cap on an exec's timeout
REMOTE_TRANSFER_DIR: str = _REMOTE_TRANSFER_DIR  # where a sandbox stages Harbor's transfer archives
ENV_TRANSFER_TAR_DIR: PurePosixPath = _ENV_TRANSFER_TAR_DIR  # where Harbor's filtered download packs
TRANSFER_PACK_TIMEOUT_SEC: int = _TRANSFER_PACK_TIMEOUT_SEC  # how long that pack may take


def sanitize_dns_name(value: str) -> str:
    """Harbor's DNS-1123 sandbox name for ``value`` (``hb-{session_id}``), deterministic."""
    name: str = _sanitize_dns_name(value)
    return name
