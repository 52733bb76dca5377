"""Harbor datasets on disk: discovering tasks at any depth and rejecting bad ones early.

Harbor's own ``harbor run -p`` looks one level down; datasets in the wild nest tasks in
groups, so a task here is any directory holding ``task.toml`` and its id is its path
relative to the dataset root (``group/my-task``). Every check runs before a sandbox
starts, and each failure names the file and the problem in one line.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from osmosis_harbor.errors import DatasetError
from osmosis_harbor.task_toml import TASK_CONFIG, task_config

INSTRUCTION = "instruction.md"
SKIP_DIRS = {".git", "__pycache__", ".venv", "node_modules", ".nox"}


class TaskRef(BaseModel):
    """A task found on disk: its dataset-relative id and its directory."""

    model_config = ConfigDict(frozen=True)

    id: str
    path: Path


def is_task_dir(path: Path) -> bool:
    return (path / TASK_CONFIG).is_file()


def discover_tasks(root: Path) -> list[TaskRef]:
    """All tasks under ``root`` (or ``root`` itself when it is a task), sorted by id.

    A task's own subdirectories are not searched: ``environment/`` or ``tests/`` may
    legitimately contain files named ``task.toml``.
    """
    root = Path(root)
    if not root.exists():
        raise DatasetError(f"{root}: no such file or directory")
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory (expected a task or a dataset of tasks)")
    if is_task_dir(root):
        return [TaskRef(id=root.resolve().name, path=root.resolve())]
    found: list[TaskRef] = []
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        current = Path(dirpath)
        if is_task_dir(current):
            found.append(TaskRef(id=current.relative_to(root).as_posix(), path=current.resolve()))
            dirnames.clear()
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
    if not found:
        raise DatasetError(f"{root}: not a Harbor task or dataset (no {TASK_CONFIG} found at any depth)")
    return sorted(found, key=lambda ref: ref.id)


def select_tasks(tasks: Sequence[TaskRef], ids: Iterable[str] | None) -> list[TaskRef]:
    """Restrict ``tasks`` to ``ids`` (in the given order); unknown ids are an error."""
    wanted = list(ids or [])
    if not wanted:
        return list(tasks)
    by_id = {t.id: t for t in tasks}
    unknown = [i for i in wanted if i.strip("/") not in by_id]
    if unknown:
        sample = ", ".join(sorted(by_id)[:8])
        raise DatasetError(
            f"unknown task id(s): {', '.join(unknown)} (known: {sample}{', ...' if len(by_id) > 8 else ''})"
        )
    return [by_id[i.strip("/")] for i in dict.fromkeys(wanted)]


def symlink_problem(task_dir: Path) -> str | None:
    """What is wrong with the first bad symlink under ``task_dir``, if any: one whose
    target lies outside the task, or a loop (``a -> b -> a``, ``a -> a``), which no
    copy, upload or hash of the task could follow."""
    root = Path(os.path.realpath(task_dir))
    for dirpath, dirnames, filenames in os.walk(task_dir, followlinks=False):
        for name in sorted([*dirnames, *filenames]):
            entry = Path(dirpath) / name
            if not entry.is_symlink():
                continue
            target = os.readlink(entry)
            try:
                os.path.realpath(entry, strict=True)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return f"symlink {entry} ({name} -> {target}) is a loop; remove it or point it at a file"
            resolved = Path(os.path.realpath(entry))  # dangling links are allowed
            if resolved != root and root not in resolved.parents:
                return f"symlink {entry} points outside the task ({target}); copy the file into the task instead"
    return None


COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def compose_file(task_dir: Path, config: Any) -> Path | None:
    """The first multi-container definition the task carries, if any.

    Harbor's Docker environment runs ``environment/docker-compose.yaml`` (sidecars, a
    compose-only ``main``), and a separate verifier may bring its own under ``tests/``.
    A sandbox is one container, so such a task cannot run faithfully in one."""
    candidates = [task_dir / "environment", task_dir / "tests"]
    candidates += [task_dir / "steps" / step.name / "tests" for step in (config.steps or [])]
    for directory in candidates:
        for name in COMPOSE_FILES:
            if (directory / name).is_file():
                return directory / name
    return None


def check_task(task: TaskRef, *, needs_tests: bool = True) -> None:
    """Raise ``DatasetError`` naming the file and the problem when ``task`` is unusable.

    ``needs_tests=False`` for rollouts, where an Osmosis grader may stand in for a task
    without ``tests/`` (validation always needs the task's own tests).

    Harbor's own ``Task`` model is the authority on the format (single- and multi-step
    layouts, tests per step or shared, containment of tests/ and solution/); our checks
    sit on top: one-line TOML and field errors, multi-container tasks, and symlinks that
    leave the task anywhere (Harbor checks only tests/ and solution/)."""
    from harbor.models.task.task import Task

    if any("\ud800" <= c <= "\udfff" for c in str(task.path)):  # undecodable bytes: Harbor's JSON cannot hold them
        raise DatasetError(f"task {task.id}: its path is not UTF-8 (Harbor records it in JSON files): rename it")
    config = task_config(task.path)
    compose = compose_file(task.path, config)
    if compose is not None:
        raise DatasetError(
            f"task {task.id}: multi-container tasks ({compose.relative_to(task.path).as_posix()}) "
            "are not supported by sandbox environments"
        )
    if not config.steps and not (task.path / INSTRUCTION).is_file():
        raise DatasetError(f"task {task.id}: {task.path / INSTRUCTION} is missing")
    problem = symlink_problem(task.path)
    if problem is not None:
        raise DatasetError(f"task {task.id}: {problem}")
    try:
        Task(task.path, disable_verification=not needs_tests)
    except (OSError, ValueError, RuntimeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetError(f"task {task.id}: {message}") from None


def load_dataset(root: Path, ids: Iterable[str] | None = None) -> list[TaskRef]:
    """Discover, select and check tasks; raises ``DatasetError`` on the first problem."""
    tasks = select_tasks(discover_tasks(root), ids)
    for task in tasks:
        check_task(task)
    return tasks
