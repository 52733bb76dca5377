"""An operator's seccomp profile for local sandboxes, and the change that makes one refuse the
preallocation the file size limit cannot see.

``fallocate`` with ``FALLOC_FL_KEEP_SIZE`` allocates blocks past a file's end without growing it,
and the kernel checks ``RLIMIT_FSIZE`` only against a new size, so one such call takes gigabytes of
the host's disk before the watch's next tick (``docker/disk_watch.py``). A seccomp rule can refuse
exactly that call; io_uring's fallocate passes no seccomp filter, so io_uring goes too (Docker
25 removed it from its default profile; 20.10, the engine here, allows it). Docker takes one
profile per container, in place of its own default, and does not expose that default; so the
restriction is applied to a profile the operator gives (Docker's ``default.json`` for the engine's
version), never to one made up here: ``python -m osmosis_harbor seccomp-profile default.json -o
restricted.json``, then ``OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE=restricted.json``.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from osmosis_harbor.errors import ConfigError

__all__ = ["read_profile", "restrict_preallocation"]

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02  # only with KEEP_SIZE: frees blocks, allocates none
IO_URING = ("io_uring_setup", "io_uring_enter", "io_uring_register")
SETTING = "OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE"


def _mode(mask: int, value: int) -> dict[str, Any]:
    """A condition on ``fallocate``'s mode argument: ``mode & mask == value``."""
    return {"index": 1, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


_BOTH = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
RULES: list[dict[str, Any]] = [
    # Growing a file (the size limit checks the new size), or punching a hole: allowed.
    {"names": ["fallocate"], "action": "SCMP_ACT_ALLOW", "args": [_mode(FALLOC_FL_KEEP_SIZE, 0)]},
    {"names": ["fallocate"], "action": "SCMP_ACT_ALLOW", "args": [_mode(_BOTH, _BOTH)]},
    # Allocating past the end while keeping the size: "not supported", as on a filesystem without it.
    {
        "names": ["fallocate"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": errno.EOPNOTSUPP,
        "args": [_mode(_BOTH, FALLOC_FL_KEEP_SIZE)],
    },
    {"names": list(IO_URING), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
]
_REPLACED = {"fallocate", *IO_URING}


def restrict_preallocation(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` (Docker's format) with ``fallocate`` and io_uring taken out of its own rules
    and ``RULES`` added: everything else it allows or refuses stays as it was."""
    _check(profile, "the profile")
    syscalls = []
    for rule in profile.get("syscalls") or []:
        if rule.get("name") in _REPLACED:  # the older format's one name per rule
            continue
        if "names" not in rule:
            syscalls.append(rule)
        elif names := [name for name in rule["names"] or [] if name not in _REPLACED]:
            syscalls.append({**rule, "names": names})
    return {**profile, "syscalls": syscalls + [dict(rule) for rule in RULES]}


def read_profile(path: Path, what: str | None = None) -> str:
    """The profile at ``path`` as the engine takes it (JSON text), checked to be one; errors name
    it as ``what`` (default: the setting that names it)."""
    what = what or f"{SETTING}={str(path)!r}"
    try:
        profile = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{what} cannot be read as JSON: {exc}") from None
    _check(profile, what)
    return json.dumps(profile, separators=(",", ":"))


def _check(profile: object, what: str) -> None:
    if not isinstance(profile, dict) or not isinstance(profile.get("defaultAction"), str):
        raise ConfigError(
            f"{what} is not a seccomp profile in Docker's format (a JSON object with a defaultAction); "
            "start from Docker's default.json for the engine's version"
        )
    if not isinstance(profile.get("syscalls") or [], list):
        raise ConfigError(f"{what}: its syscalls is not a list")
