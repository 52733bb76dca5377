"""The two facts Harbor's trial lock reads from ``task.toml``, each parsed once per distinct text.

Why: ``build_trial_lock`` (every trial, ``harbor/models/job/lock.py``) asks
``_task_package_version`` and ``_task_verifier_environment_mode``, and each reads the task's
``task.toml`` and parses and validates a whole ``TaskConfig`` again, on top of the task load's
own parse: two of a trial's three ``task.toml`` parses. Both answers are immutable values that
depend on the file's text alone, so these compute them as Harbor does, once per distinct text
(the file is still read each time, so an edited task is seen at once). Installed by
``fastpaths`` over the verified Harbor source; ``tests/unit/harbor_compat/test_fastpaths.py``
compares them with Harbor's own on valid, invalid, multi-step and versioned task files.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

__all__ = ["task_package_version", "task_verifier_environment_mode"]


def task_package_version(task_dir: Path) -> str | None:
    """Harbor's ``_task_package_version``: the ``[task]`` version, None when unreadable."""
    try:
        text = (task_dir / "task.toml").read_text()
    except Exception:
        return None
    return _package_version(text)


def task_verifier_environment_mode(task_dir: Path) -> Any:
    """Harbor's ``_task_verifier_environment_mode``: the trial-level verifier mode, None for a
    multi-step task or an unreadable ``task.toml``."""
    try:
        text = (task_dir / "task.toml").read_text()
    except Exception:
        return None
    return _verifier_mode(text)


@functools.lru_cache(maxsize=256)
def _package_version(text: str) -> str | None:
    from harbor.models.job.lock import TaskDefinitionConfig

    try:
        task = TaskDefinitionConfig.model_validate_toml(text).task
    except Exception:
        return None
    return task.version if task is not None else None


@functools.lru_cache(maxsize=256)
def _verifier_mode(text: str) -> Any:
    from harbor.models.job.lock import TaskDefinitionConfig, resolve_task_verifier_mode

    try:
        config = TaskDefinitionConfig.model_validate_toml(text)
    except Exception:
        return None
    if config.steps:
        return None
    return resolve_task_verifier_mode(config)
