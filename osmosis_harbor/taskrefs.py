"""Which task a rollout runs: task modes, dataset ids and per-rollout ``harbor_task`` refs.

Host-side only. ``TaskResolver.resolve(metadata)`` turns a request's metadata into a task
directory on this machine (``ResolvedTask``); ``osmosis_harbor.tasks.materialize_task``
then copies it for the rollout.

Metadata keys, in order of precedence:

``harbor_task`` (both modes) names a task for this one rollout:

* a local path: absolute (``/srv/tasks/foo``) or explicitly relative (``./foo``,
  ``../foo``). Relative paths are resolved against ``tasks_dir`` in both modes (in
  template mode ``tasks_dir`` is the template task itself, so a sibling is ``../foo``).
  The directory must hold ``task.toml``. Bare ``group/name`` is *not* a path: it is
  read as a package (use ``./group/name`` for a path, or ``harbor_task_id``).
* a Harbor registry package ``org/name@ref`` (``org/name`` means ``@latest``). Pinned
  refs are digests (``@sha256:<hex>``) and revisions (``@3``); tags (``latest``,
  ``stable``) move and are warned about.
* a git task: ``harbor_task`` is the task's path inside the repository, with
  ``metadata["git_url"]`` and, to pin it, ``metadata["git_commit_id"]`` (a full
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

import asyncio
import contextlib
import difflib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

from .dataset import (
    _SKIP_DIRS,
    DatasetError,
    TaskRef,
    check_task,
    discover_tasks,
    is_task_dir,
)

logger = logging.getLogger(__name__)

TASK_KEY = "harbor_task"
TASK_ID_KEY = "harbor_task_id"
GIT_URL_KEY = "git_url"
GIT_COMMIT_KEY = "git_commit_id"

_FULL_SHA = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")
_GIT_REV = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
_GIT_URL = re.compile(
    r"^(?:(?:https?|ssh|git|file)://[^\s]+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+|/[^\s]+)$"
)
_PACKAGE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
_PACKAGE_TAG = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{1,64}$")


class TaskMode(StrEnum):
    TEMPLATE = "template"
    DATASET = "dataset"


class TaskResolutionError(ValueError):
    """Bad task input; the message names the offending key or value and the fix."""


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


_warned_refs: set[str] = set()  # process-wide: one warning per unpinned ref


def _warn_unpinned(key: str, message: str) -> None:
    if key in _warned_refs:
        return
    _warned_refs.add(key)
    logger.warning(message)
    warnings.warn(message, UnpinnedTaskRefWarning, stacklevel=3)


def _fail(message: str) -> TaskResolutionError:
    return TaskResolutionError(message)


def _relative_parts(value: str, what: str) -> tuple[str, ...]:
    """Split a relative, slash-separated path; reject anything that could leave its root."""
    hint = f"{what} must be a relative path with '/' separators, like 'group/task'"
    if not value or not value.strip("/"):
        raise _fail(f"{what} is empty; {hint}")
    if "\\" in value or "\x00" in value:
        raise _fail(f"{what}={value!r} contains a backslash or NUL; {hint}")
    if value.startswith("/") or PurePosixPath(value).is_absolute():
        raise _fail(f"{what}={value!r} is an absolute path; {hint}")
    parts = tuple(value.rstrip("/").split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise _fail(f"{what}={value!r} has a {part or 'empty'!r} segment; {hint}")
    return parts


def _leaf_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _redact(url: str) -> str:
    """``url`` without credentials (``https://user:token@host`` -> ``https://***@host``)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@", r"\1***@", url)


def _describe_fetch_error(exc: BaseException, secret_url: str | None = None) -> str:
    text = _describe_leaf(_leaf_error(exc))
    if secret_url and _redact(secret_url) != secret_url:
        text = text.replace(secret_url, _redact(secret_url))
        text = re.sub(r"://[^/@\s]+@", "://***@", text)
    return text


def _describe_leaf(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
        cmd = " ".join(str(a) for a in (exc.cmd or [])[:3])
        return f"`{cmd}` failed (exit {exc.returncode}): {lines[-1] if lines else 'no output'}"
    return f"{type(exc).__name__}: {exc}"


@contextlib.asynccontextmanager
async def _file_lock(path: Path) -> AsyncIterator[None]:
    """An exclusive ``flock`` on ``path``, polled so that waiting never blocks the loop."""
    if fcntl is None:  # not POSIX: in-process locking only
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _snapshot(source: Path, target: Path) -> Path:
    """Copy ``source`` to ``target`` once (atomically); an existing ``target`` is reused."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        shutil.copytree(source, staging / "task", symlinks=True)
        try:
            os.rename(staging / "task", target)
        except OSError:
            if not target.is_dir():  # anything but "another process made it first"
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


class TaskResolver:
    """Resolves request metadata to a task directory, per the configured task mode.

    Construction validates ``tasks_dir`` eagerly (template: one task directory; dataset:
    a directory of tasks at any depth). ``fetch_count`` counts ``TaskClient`` downloads.
    """

    def __init__(self, tasks_dir: Path, mode: TaskMode | str, *, cache_dir: Path | None = None):
        try:
            self.mode = TaskMode(mode)
        except ValueError:
            raise _fail(f"task_mode={mode!r} is not a task mode; use 'template' or 'dataset'") from None
        self.tasks_dir = Path(tasks_dir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.fetch_count = 0
        self._root = self.tasks_dir.resolve()
        self._by_id: dict[str, Path] = {}
        self._checked: dict[Path, None] = {}
        self._resolved: dict[tuple[Any, ...], ResolvedTask] = {}
        self._locks: dict[tuple[Any, ...], asyncio.Lock] = {}
        self._client: Any = None
        if not self.tasks_dir.is_dir():
            raise _fail(f"tasks_dir={str(self.tasks_dir)!r} is not a directory")
        if self.mode is TaskMode.TEMPLATE:
            if not is_task_dir(self._root):
                raise _fail(
                    f"tasks_dir={str(self.tasks_dir)!r} has no task.toml: template mode needs one task "
                    "directory (use task_mode='dataset' for a directory of tasks)"
                )
            self._template = ResolvedTask(task_id=self._root.name, path=self._root, source="template")
            self._check(self._root, self._root.name, "tasks_dir")
        else:
            if is_task_dir(self._root):
                raise _fail(
                    f"tasks_dir={str(self.tasks_dir)!r} is itself a task: use task_mode='template', "
                    "or point tasks_dir at the directory that holds your tasks"
                )
            try:
                found = discover_tasks(self.tasks_dir)
            except DatasetError as exc:
                raise _fail(f"tasks_dir: {exc}") from None
            self._by_id = {t.id: t.path for t in found}

    def task_ids(self) -> list[str]:
        if self.mode is TaskMode.TEMPLATE:
            return [self._template.task_id]
        return sorted(self._by_id)

    async def resolve(self, metadata: dict[str, Any] | None) -> ResolvedTask:
        metadata = metadata or {}
        if not isinstance(metadata, dict):
            raise _fail(f"request metadata must be a JSON object, got {type(metadata).__name__}")
        ref = metadata.get(TASK_KEY)
        if ref is not None:
            return await self._resolve_ref(ref, metadata)
        if metadata.get(GIT_URL_KEY) is not None:
            raise _fail(
                f"metadata[{GIT_URL_KEY!r}] is set without metadata[{TASK_KEY!r}]: set "
                f"{TASK_KEY!r} to the task's path inside the repository"
            )
        if self.mode is TaskMode.TEMPLATE:
            return self._template
        task_id = metadata.get(TASK_ID_KEY)
        if task_id is None:
            raise _fail(
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
            raise _fail(f"{key}={label!r}: {exc}") from None
        self._checked[path] = None

    def _resolve_dataset_id(self, task_id: Any) -> ResolvedTask:
        key = f"metadata[{TASK_ID_KEY!r}]"
        if not isinstance(task_id, str):
            raise _fail(f"{key} must be a string task id, got {type(task_id).__name__}")
        parts = _relative_parts(task_id, key)
        norm = "/".join(parts)
        real = self._root.joinpath(*parts).resolve()
        if not real.is_relative_to(self._root):
            raise _fail(f"{key}={task_id!r} leads outside tasks_dir (through a symlink) to {real}")
        known = self._by_id.get(norm)
        if known is None or known != real:
            # Not found at startup (or moved since): accept only what discovery would find.
            if not (is_task_dir(real) and self._discoverable(parts)):
                raise _fail(f"{key}={task_id!r}: no such task under {self.tasks_dir}; known ids: {self._examples(norm)}")
            self._by_id[norm] = real
        self._check(real, norm, key)
        return ResolvedTask(task_id=norm, path=real, source="dataset", ref=task_id)

    def _discoverable(self, parts: tuple[str, ...]) -> bool:
        current = self._root
        for part in parts[:-1]:
            current = current / part
            if part in _SKIP_DIRS or current.is_symlink() or is_task_dir(current):
                return False
        return parts[-1] not in _SKIP_DIRS

    def _resolve_local(self, value: str) -> ResolvedTask:
        key = f"metadata[{TASK_KEY!r}]"
        if "\x00" in value:
            raise _fail(f"{key}={value!r} contains NUL")
        path = Path(value) if value.startswith("/") else self._root / value
        real = path.resolve()
        if not real.is_dir():
            raise _fail(f"{key}={value!r}: {real} is not a directory (local task refs must name a task directory)")
        if not is_task_dir(real):
            raise _fail(f"{key}={value!r}: {real} has no task.toml, so it is not a Harbor task")
        self._check(real, value, key)
        return ResolvedTask(task_id=real.name, path=real, source="local", ref=value)

    # -- harbor_task refs --------------------------------------------------------------

    async def _resolve_ref(self, ref: Any, metadata: dict[str, Any]) -> ResolvedTask:
        key = f"metadata[{TASK_KEY!r}]"
        if not isinstance(ref, str) or not ref.strip():
            raise _fail(f"{key} must be a non-empty string (a local path, 'org/name@ref' or a git task path)")
        git_url = metadata.get(GIT_URL_KEY)
        commit = metadata.get(GIT_COMMIT_KEY)
        if git_url is not None:
            return await self._resolve_git(ref, git_url, commit)
        if commit is not None:
            raise _fail(f"metadata[{GIT_COMMIT_KEY!r}] is set without metadata[{GIT_URL_KEY!r}]: set the repository URL too")
        if ref.startswith(("/", "./", "../")) or ref in (".", ".."):
            return self._resolve_local(ref)
        return await self._resolve_package(ref)

    async def _once(
        self, key: tuple[Any, ...], fetch: Callable[[], Awaitable[ResolvedTask]]
    ) -> ResolvedTask:
        hit = self._resolved.get(key)
        if hit is not None and hit.path.is_dir():
            return hit
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = self._resolved.get(key)
            if hit is not None and hit.path.is_dir():
                return hit
            resolved = await fetch()
            self._resolved[key] = resolved
            return resolved

    def _task_client(self) -> Any:
        if self._client is None:
            from harbor.tasks.client import TaskClient

            self._client = TaskClient()
        return self._client

    async def _download(
        self, task_id: Any, output_dir: Path | None, default_dir: Path, what: str, url: str | None = None
    ) -> Any:
        """One ``TaskClient.download_tasks`` call, serialized across processes per ref.

        Harbor replaces (git) or re-extracts (packages) a task directory in place; the
        file lock keeps two processes sharing a cache from doing so under each other.
        """
        self.fetch_count += 1
        root = output_dir if output_dir is not None else default_dir
        name = hashlib.sha256(repr(task_id).encode()).hexdigest()[:32]
        try:
            async with _file_lock(root / ".osmosis-locks" / f"{name}.lock"):
                batch = await self._task_client().download_tasks([task_id], output_dir=output_dir)
        except Exception as exc:
            secret = url is not None and _redact(url) != url  # keep credentials out of tracebacks too
            raise _fail(f"{what}: could not fetch the task: {_describe_fetch_error(exc, url)}") from (
                None if secret else exc
            )
        return batch.results[0]

    def _finish(self, result_path: Path, what: str, **fields: Any) -> ResolvedTask:
        path = Path(result_path).resolve()
        if not is_task_dir(path):
            raise _fail(f"{what}: the fetched directory {path} has no task.toml, so it is not a Harbor task")
        self._check(path, fields["task_id"], f"metadata[{TASK_KEY!r}]")
        return ResolvedTask(path=path, **fields)

    async def _resolve_git(self, ref: str, git_url: Any, commit: Any) -> ResolvedTask:
        from harbor.models.task.id import GitTaskId

        if not isinstance(git_url, str) or git_url.startswith("-") or not _GIT_URL.match(git_url):
            shown = _redact(git_url) if isinstance(git_url, str) else git_url
            raise _fail(
                f"metadata[{GIT_URL_KEY!r}]={shown!r} is not a git URL; use https://, ssh://, git://, "
                "file:// or user@host:path"
            )
        if commit is not None and (not isinstance(commit, str) or not _GIT_REV.match(commit)):
            raise _fail(
                f"metadata[{GIT_COMMIT_KEY!r}]={commit!r} is not a commit; pin the full 40-hex commit sha"
            )
        shown_url = _redact(git_url)
        parts = _relative_parts(ref, f"metadata[{TASK_KEY!r}] (the task's path inside {shown_url})")
        path = "/".join(parts)
        pinned = commit is not None and bool(_FULL_SHA.match(commit))
        what = f"git task {path!r} in {shown_url} @ {commit or 'HEAD'}"
        task_id = GitTaskId(git_url=git_url, git_commit_id=commit, path=Path(path))

        async def fetch() -> ResolvedTask:
            from harbor.constants import TASK_CACHE_DIR

            result = await self._download(task_id, self.cache_dir, TASK_CACHE_DIR, what, git_url)
            fetched = result.resolved_git_commit_id or commit
            task_path = Path(result.path)
            if not pinned:
                # Harbor re-fetches an unpinned ref into the same directory on every call;
                # serve this process from an immutable per-commit snapshot instead.
                root = self.cache_dir if self.cache_dir is not None else TASK_CACHE_DIR
                digest = hashlib.sha256(f"{git_url}\0{path}\0{fetched}".encode()).hexdigest()[:32]
                task_path = _snapshot(task_path, root / "osmosis-snapshots" / digest / task_path.name)
                _warn_unpinned(
                    f"git|{git_url}|{commit}|{path}",
                    f"{what} is not pinned: fetched commit {fetched} once for this process; set "
                    f"metadata[{GIT_COMMIT_KEY!r}]={fetched!r} to make rollouts reproducible",
                )
            return self._finish(
                task_path, what, task_id=path, source="git", ref=ref, pinned=pinned,
                git_url=shown_url, git_commit_id=fetched,
            )

        return await self._once(("git", git_url, commit, path), fetch)

    async def _resolve_package(self, ref: str) -> ResolvedTask:
        from harbor.models.task.id import PackageTaskId

        key = f"metadata[{TASK_KEY!r}]"
        name, _, version = ref.partition("@")
        version = version or "latest"
        if not _PACKAGE_NAME.match(name) or ".." in name:
            raise _fail(
                f"{key}={ref!r} is neither a local path (start it with '/', './' or '../'), a package "
                f"'org/name@ref', nor a git task (set metadata[{GIT_URL_KEY!r}])"
            )
        digest, revision = bool(_DIGEST.match(version)), version.isdigit()
        if not (digest or revision or _PACKAGE_TAG.match(version)):
            raise _fail(f"{key}={ref!r}: {version!r} is not a package ref; use a tag, a revision number or sha256:<hex>")
        org, pkg = name.split("/", 1)
        pinned = digest or revision
        what = f"package {name}@{version}"
        task_id = PackageTaskId(org=org, name=pkg, ref=version)
        output_dir = self.cache_dir / "packages" if self.cache_dir is not None else None

        async def fetch() -> ResolvedTask:
            from harbor.constants import PACKAGE_CACHE_DIR

            result = await self._download(task_id, output_dir, PACKAGE_CACHE_DIR, what)
            if not pinned:
                _warn_unpinned(
                    f"package|{name}@{version}",
                    f"{what} uses the moving tag {version!r}: resolved it once for this process to "
                    f"sha256:{result.content_hash}; pin '{name}@sha256:{result.content_hash}' to make "
                    "rollouts reproducible",
                )
            return self._finish(
                result.path, what, task_id=f"{name}@{version}", source="package", ref=ref,
                pinned=pinned, content_hash=result.content_hash,
            )

        return await self._once(("package", name, version), fetch)
