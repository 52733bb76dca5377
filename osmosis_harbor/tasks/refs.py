"""Which task a rollout runs: task modes, dataset ids and per-rollout ``harbor_task`` refs.

Host-side only. ``TaskResolver.resolve(metadata)`` turns a request's metadata into a task
directory on this machine (``ResolvedTask``); ``osmosis_harbor.tasks.materialize.materialize_task``
then copies it for the rollout.

Metadata keys, in order of precedence:

``harbor_task`` (both modes) names a task for this one rollout:

* a local path: absolute (``/srv/tasks/foo``) or explicitly relative (``./foo``,
  ``../foo``). Relative paths are resolved against ``tasks_dir`` in both modes (in
  template mode ``tasks_dir`` is the template task itself, so a sibling is ``../foo``).
  Wherever it is written, it must resolve (symlinks followed) inside ``tasks_dir`` or a
  ``task_roots=`` directory, and never inside a trials directory (``tasks.roots``).
  The directory must hold ``task.toml``. Bare ``group/name`` is *not* a path: it is
  read as a package (use ``./group/name`` for a path, or ``harbor_task_id``).
* a Harbor registry package ``org/name@ref`` (``org/name`` means ``@latest``). Pinned
  refs are digests (``@sha256:<hex>``) and revisions (``@3``); tags (``latest``,
  ``stable``) move and are warned about.
* a git task: ``harbor_task`` is the task's path inside the repository, with
  ``metadata["git_url"]`` (``https://``, ``ssh://`` or ``git@host:path``; ``file://`` and
  bare paths only with ``allow_local_git=True``) and, to pin it, ``metadata["git_commit_id"]`` (a full
  40/64-hex sha; anything else, or no commit, is unpinned and warned about).

``harbor_task_id`` (dataset mode): a task id under ``tasks_dir`` (``group/task``).
In template mode it is ignored and the template is used.

Packages and git tasks are fetched with Harbor's ``TaskClient.download_tasks`` into
Harbor's task cache (or ``cache_dir``). Each distinct ref is resolved once per
``TaskResolver`` (guarded by a per-ref ``asyncio.Lock``), so concurrent rollouts of
the same ref share one fetch. Unpinned refs are also resolved once, at first use,
and that snapshot serves the process; one ``UnpinnedTaskRefWarning`` per ref per
process says so.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict

from osmosis_harbor.errors import TaskResolutionError

__all__ = [
    "GIT_COMMIT_KEY",
    "GIT_URL_KEY",
    "TASK_ID_KEY",
    "TASK_KEY",
    "ResolvedTask",
    "TaskMode",
    "UnpinnedTaskRefWarning",
    "relative_parts",
]

TASK_KEY = "harbor_task"
TASK_ID_KEY = "harbor_task_id"
GIT_URL_KEY = "git_url"
GIT_COMMIT_KEY = "git_commit_id"


class TaskMode(StrEnum):
    TEMPLATE = "template"
    DATASET = "dataset"


class UnpinnedTaskRefWarning(UserWarning):
    """A ``harbor_task`` ref that can change over time (no commit pin, or a moving tag)."""


class ResolvedTask(BaseModel):
    """A task directory on this machine, ready to be materialized for one rollout."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    path: Path
    source: Literal["template", "dataset", "local", "package", "git"]
    ref: str | None = None  # the metadata value it came from (harbor_task / harbor_task_id)
    pinned: bool = True
    git_url: str | None = None
    git_commit_id: str | None = None  # for git: the commit actually fetched
    content_hash: str | None = None  # for packages: the registry content hash


def fail(message: str) -> TaskResolutionError:
    return TaskResolutionError(message)


def relative_parts(value: str, what: str) -> tuple[str, ...]:
    """Split a relative, slash-separated path; reject anything that could leave its root."""
    hint = f"{what} must be a relative path with '/' separators, like 'group/task'"
    if not value or not value.strip("/"):
        raise fail(f"{what} is empty; {hint}")
    if "\\" in value or "\x00" in value:
        raise fail(f"{what}={value!r} contains a backslash or NUL; {hint}")
    if value.startswith("/") or PurePosixPath(value).is_absolute():
        raise fail(f"{what}={value!r} is an absolute path; {hint}")
    parts = tuple(value.rstrip("/").split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise fail(f"{what}={value!r} has a {part or 'empty'!r} segment; {hint}")
    return parts
