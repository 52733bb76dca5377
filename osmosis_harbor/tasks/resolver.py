"""Which task a rollout runs: the task mode, dataset ids, local paths and remote refs.

``TaskResolver.resolve(metadata)`` turns a request's metadata into a task directory on this
machine (``ResolvedTask``); see ``osmosis_harbor.tasks.refs`` for the metadata keys and their
precedence, and ``osmosis_harbor.tasks.remote`` for packages and git tasks.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from osmosis_harbor.errors import DatasetError
from osmosis_harbor.tasks.discovery import (
    SKIP_DIRS,
    TaskRef,
    check_task,
    discover_tasks,
    is_task_dir,
)
from osmosis_harbor.tasks.refs import (
    GIT_COMMIT_KEY,
    GIT_URL_KEY,
    TASK_ID_KEY,
    TASK_KEY,
    ResolvedTask,
    TaskMode,
    fail,
    relative_parts,
)
from osmosis_harbor.tasks.remote import RemoteTasks
from osmosis_harbor.tasks.roots import TaskRoots

__all__ = ["TaskResolver"]


class TaskResolver:
    """Resolves request metadata to a task directory, per the configured task mode.

    Construction validates ``tasks_dir`` eagerly (template: one task directory; dataset:
    a directory of tasks at any depth). ``fetch_count`` counts ``TaskClient`` downloads.
    A local ``harbor_task`` must lie inside ``tasks_dir`` or one of ``task_roots``, never in a
    directory ``trials_dirs`` returns; local git repositories need ``allow_local_git``, and git
    hosts that are not public ``allow_private_git_hosts``.
    """

    def __init__(
        self,
        tasks_dir: Path,
        mode: TaskMode | str,
        *,
        cache_dir: Path | None = None,
        task_roots: Sequence[Path] = (),
        allow_local_git: bool = False,
        allow_private_git_hosts: bool = False,
        trials_dirs: Callable[[], Iterable[Path]] | None = None,
    ):
        try:
            self.mode = TaskMode(mode)
        except ValueError:
            raise fail(f"task_mode={mode!r} is not a task mode; use 'template' or 'dataset'") from None
        self.tasks_dir = Path(tasks_dir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._root = self.tasks_dir.resolve()
        self._by_id: dict[str, Path] = {}
        self._checked: dict[Path, None] = {}
        self.roots = TaskRoots(
            [self._root, *task_roots],
            trials_dirs,
            allow_local_git=allow_local_git,
            allow_private_git_hosts=allow_private_git_hosts,
        )
        self._remote = RemoteTasks(self.cache_dir, self._check, self.roots)
        if not self.tasks_dir.is_dir():
            raise fail(f"tasks_dir={str(self.tasks_dir)!r} is not a directory")
        if self.mode is TaskMode.TEMPLATE:
            if not is_task_dir(self._root):
                raise fail(
                    f"tasks_dir={str(self.tasks_dir)!r} has no task.toml: template mode needs one task "
                    "directory (use task_mode='dataset' for a directory of tasks)"
                )
            self._template = ResolvedTask(task_id=self._root.name, path=self._root, source="template")
            self._check(self._root, self._root.name, "tasks_dir")
        else:
            if is_task_dir(self._root):
                raise fail(
                    f"tasks_dir={str(self.tasks_dir)!r} is itself a task: use task_mode='template', "
                    "or point tasks_dir at the directory that holds your tasks"
                )
            try:
                found = discover_tasks(self.tasks_dir)
            except DatasetError as exc:
                raise fail(f"tasks_dir: {exc}") from None
            self._by_id = {t.id: t.path for t in found}

    @property
    def fetch_count(self) -> int:
        return self._remote.fetch_count

    def task_ids(self) -> list[str]:
        if self.mode is TaskMode.TEMPLATE:
            return [self._template.task_id]
        return sorted(self._by_id)

    async def resolve(self, metadata: dict[str, Any] | None) -> ResolvedTask:
        metadata = metadata or {}
        if not isinstance(metadata, dict):
            raise fail(f"request metadata must be a JSON object, got {type(metadata).__name__}")
        ref = metadata.get(TASK_KEY)
        if ref is not None:
            return await self._resolve_ref(ref, metadata)
        if metadata.get(GIT_URL_KEY) is not None:
            raise fail(
                f"metadata[{GIT_URL_KEY!r}] is set without metadata[{TASK_KEY!r}]: set "
                f"{TASK_KEY!r} to the task's path inside the repository"
            )
        if self.mode is TaskMode.TEMPLATE:
            return self._template
        task_id = metadata.get(TASK_ID_KEY)
        if task_id is None:
            raise fail(
                f"dataset mode needs metadata[{TASK_ID_KEY!r}] (a task id under {self.tasks_dir}, e.g. "
                f"{self._examples()}) or metadata[{TASK_KEY!r}] (a local path, 'org/name@ref' or a git task)"
            )
        return self._resolve_dataset_id(task_id)

    # -- dataset ids and local paths ---------------------------------------------------

    def _examples(self, near: str | None = None) -> str:
        ids = sorted(self._by_id)
        picks = difflib.get_close_matches(near, ids, n=3, cutoff=0.5) if near else []
        picks += [i for i in ids if i not in picks][: max(0, 5 - len(picks))]
        more = f" and {len(ids) - len(picks)} more" if len(ids) > len(picks) else ""
        return ", ".join(repr(i) for i in picks) + more

    def _check(self, path: Path, label: str, key: str) -> None:
        """Run ``dataset.check_task`` once per task directory."""
        if path in self._checked:
            return
        try:
            check_task(TaskRef(id=label, path=path), needs_tests=False)
        except DatasetError as exc:
            # The request names its task; the host path it resolved to stays on the host.
            raise fail(f"{key}={label!r}: {str(exc).replace(str(path), f'<{label}>')}") from None
        self._checked[path] = None

    def _resolve_dataset_id(self, task_id: Any) -> ResolvedTask:
        key = f"metadata[{TASK_ID_KEY!r}]"
        if not isinstance(task_id, str):
            raise fail(f"{key} must be a string task id, got {type(task_id).__name__}")
        parts = relative_parts(task_id, key)
        norm = "/".join(parts)
        real = self._root.joinpath(*parts).resolve()
        if not real.is_relative_to(self._root):
            raise fail(f"{key}={task_id!r} leads outside tasks_dir (through a symlink)")
        self.roots.check_not_trials(real, key, task_id)
        known = self._by_id.get(norm)
        if known is None or known != real:
            # Not found at startup (or moved since): accept only what discovery would find.
            if not (is_task_dir(real) and self._discoverable(parts)):
                raise fail(f"{key}={task_id!r}: no such task under tasks_dir; known ids: {self._examples(norm)}")
            self._by_id[norm] = real
        self._check(real, norm, key)
        return ResolvedTask(task_id=norm, path=real, source="dataset", ref=task_id)

    def _discoverable(self, parts: tuple[str, ...]) -> bool:
        current = self._root
        for part in parts[:-1]:
            current = current / part
            if part in SKIP_DIRS or current.is_symlink() or is_task_dir(current):
                return False
        return parts[-1] not in SKIP_DIRS

    def _resolve_local(self, value: str) -> ResolvedTask:
        key = f"metadata[{TASK_KEY!r}]"
        if "\x00" in value:
            raise fail(f"{key}={value!r} contains NUL")
        path = Path(value) if value.startswith("/") else self._root / value
        real = Path(os.path.realpath(path))
        self.roots.check_local(real, key, value)  # before existence: a refusal reveals nothing
        if not real.is_dir():
            raise fail(f"{key}={value!r} is not a directory (local task refs must name a task directory)")
        if not is_task_dir(real):
            raise fail(f"{key}={value!r} has no task.toml, so it is not a Harbor task")
        self._check(real, value, key)
        return ResolvedTask(task_id=real.name, path=real, source="local", ref=value)

    # -- harbor_task refs --------------------------------------------------------------

    async def _resolve_ref(self, ref: Any, metadata: dict[str, Any]) -> ResolvedTask:
        key = f"metadata[{TASK_KEY!r}]"
        if not isinstance(ref, str) or not ref.strip():
            raise fail(f"{key} must be a non-empty string (a local path, 'org/name@ref' or a git task path)")
        git_url = metadata.get(GIT_URL_KEY)
        commit = metadata.get(GIT_COMMIT_KEY)
        if git_url is not None:
            return await self._remote.git(ref, git_url, commit)
        if commit is not None:
            raise fail(
                f"metadata[{GIT_COMMIT_KEY!r}] is set without metadata[{GIT_URL_KEY!r}]: set the repository URL too"
            )
        if ref.startswith(("/", "./", "../")) or ref in (".", ".."):
            return self._resolve_local(ref)
        return await self._remote.package(ref)
