"""Where a task's verifier allowance comes from: validate's oracle run, and the task itself.

``validate --agent oracle`` records what the task's real solution left (``save_recorded``), keyed
by the content of the task's ``task.toml``, ``environment/`` and ``solution/`` (the image and the
solution; the tests may change without it). A task may also declare, in ``task.toml``::

    [metadata.osmosis_harbor.verifier_allowance]
    paths = ["/etc/nginx/**"]   # changes a solution may make there, whatever their content
    ports = [50051]             # services a solution leaves for the tests

and ``guard_plan`` puts both into the plan of a rollout whose tests run in the agent's sandbox.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from osmosis_harbor import settings
from osmosis_harbor.errors import DatasetError
from osmosis_harbor.sandbox.guard import Allowance, GuardPlan
from osmosis_harbor.tasks.files import write_file
from osmosis_harbor.tasks.verifier import task_metadata, verifies_in_agent_sandbox

__all__ = ["allowance_key", "declared_allowance", "guard_plan", "recorded_allowance", "save_recorded"]

_KEYED = ("task.toml", "environment", "solution")


def _stamp(task_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What the key depends on, cheaply: every keyed file's name, size and mtime."""
    found = []
    for name in _KEYED:
        top = task_dir / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else []
        for path in paths:
            st = path.stat()
            found.append((str(path.relative_to(task_dir)), st.st_size, st.st_mtime_ns))
    return tuple(found)


@functools.lru_cache(maxsize=512)
def _key(task_dir: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for relative, _, _ in stamp:
        digest.update(relative.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(hashlib.sha256((Path(task_dir) / relative).read_bytes()).digest())
    return digest.hexdigest()[:32]


def allowance_key(task_dir: Path) -> str:
    """The content key of a task's allowance (its config, environment and solution)."""
    task_dir = Path(task_dir).resolve()
    return _key(str(task_dir), _stamp(task_dir))


def _path_for(task_dir: Path, config: settings.Settings) -> Path:
    return config.verifier_allowances_dir() / f"{allowance_key(task_dir)}.json"


def recorded_allowance(task_dir: Path, config: settings.Settings) -> Allowance:
    """What validate's oracle run last saw this task's solution leave (nothing when it never ran)."""
    return Allowance.read(_path_for(task_dir, config)) or Allowance()


def save_recorded(task_dir: Path, allowance: Allowance, config: settings.Settings) -> Path:
    path = _path_for(task_dir, config)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, allowance.dump())
    return path


def declared_allowance(task_dir: Path, metadata: dict[str, Any]) -> Allowance:
    """The allowance ``task.toml`` declares (see the module docstring); refuses a malformed one."""
    declared = (metadata.get("osmosis_harbor") or {}).get("verifier_allowance") or {}
    paths, ports = declared.get("paths", []), declared.get("ports", [])
    if not (isinstance(paths, list) and all(isinstance(p, str) and p.startswith("/") for p in paths)):
        raise DatasetError(
            f"{task_dir / 'task.toml'}: [metadata.osmosis_harbor.verifier_allowance] paths must be absolute path globs"
        )
    if not (isinstance(ports, list) and all(isinstance(p, int) and 0 < p < 65536 for p in ports)):
        raise DatasetError(
            f"{task_dir / 'task.toml'}: [metadata.osmosis_harbor.verifier_allowance] ports must be TCP ports"
        )
    return Allowance(globs=tuple(paths), ports=frozenset(ports))


def guard_plan(
    task_dir: Path, *, native_agent: bool, config: settings.Settings, record: bool = False
) -> GuardPlan | None:
    """The verifier guard of a trial of this task, or None when it needs none: the guard is off
    (``OSMOSIS_HARBOR_VERIFIER_GUARD=0``) or no verification runs in the agent's sandbox.
    ``record``: validate's oracle run, which records the allowance instead of enforcing it.
    ``config``: the run's settings, read once by its owner (the backend, a validation run)."""
    if not config.verifier_guard or not verifies_in_agent_sandbox(task_dir):
        return None
    declared = declared_allowance(task_dir, task_metadata(task_dir))
    allowance = declared if record else declared.merged(recorded_allowance(task_dir, config))
    return GuardPlan(allowance=allowance, processes_are_tampering=not native_agent, record_allowance=record)
