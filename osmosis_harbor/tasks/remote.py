"""``harbor_task`` refs fetched through Harbor's ``TaskClient``: registry packages and git tasks.

Each distinct ref is fetched once per ``RemoteTasks`` (guarded by a per-ref ``asyncio.Lock``,
and across processes sharing a cache by a file lock), so concurrent rollouts of the same ref
share one fetch. A git task's host is checked and pinned (``git_hosts``) just before its fetch. Unpinned refs are resolved once, at first use, and that snapshot serves the
process; one ``UnpinnedTaskRefWarning`` per ref per process says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from osmosis_harbor.tasks.discovery import is_task_dir
from osmosis_harbor.tasks.git_hosts import GitPin
from osmosis_harbor.tasks.refs import (
    GIT_COMMIT_KEY,
    GIT_URL_KEY,
    TASK_KEY,
    ResolvedTask,
    UnpinnedTaskRefWarning,
    fail,
    relative_parts,
)
from osmosis_harbor.tasks.roots import TaskRoots

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["RemoteTasks", "file_lock"]

logger = logging.getLogger(__name__)

_FULL_SHA = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")
_GIT_REV = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
_PACKAGE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
_PACKAGE_TAG = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{1,64}$")


_warned_refs: set[str] = set()  # process-wide: one warning per unpinned ref


def _warn_unpinned(key: str, message: str) -> None:
    if key in _warned_refs:
        return
    _warned_refs.add(key)
    logger.warning(message)
    warnings.warn(message, UnpinnedTaskRefWarning, stacklevel=3)


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
async def file_lock(path: Path) -> AsyncIterator[None]:
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


def _pinned_client(pin: GitPin) -> Any:
    from osmosis_harbor.tasks.git_client import PinnedTaskClient  # Harbor, imported on first use

    return PinnedTaskClient(pin)


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


CheckTask = Callable[[Path, str, str], None]  # (task dir, label, metadata key): raises when unusable


class RemoteTasks:
    """Packages and git tasks of one resolver, each fetched once. ``fetch_count`` counts
    ``TaskClient`` downloads; ``check`` validates a fetched task like any other."""

    def __init__(self, cache_dir: Path | None, check: CheckTask, roots: TaskRoots | None = None) -> None:
        self.cache_dir = cache_dir
        self._roots = roots if roots is not None else TaskRoots([])
        self.fetch_count = 0
        self._check = check
        self._resolved: dict[tuple[Any, ...], ResolvedTask] = {}
        self._locks: dict[tuple[Any, ...], asyncio.Lock] = {}
        self._client: Any = None

    async def _once(self, key: tuple[Any, ...], fetch: Callable[[], Awaitable[ResolvedTask]]) -> ResolvedTask:
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
        self,
        task_id: Any,
        output_dir: Path | None,
        default_dir: Path,
        what: str,
        url: str | None = None,
        pin: GitPin | None = None,
    ) -> Any:
        """One ``TaskClient.download_tasks`` call, serialized across processes per ref; a
        pinned git download runs git connecting only to the checked addresses.

        Harbor replaces (git) or re-extracts (packages) a task directory in place; the
        file lock keeps two processes sharing a cache from doing so under each other.
        """
        self.fetch_count += 1
        root = output_dir if output_dir is not None else default_dir
        name = hashlib.sha256(repr(task_id).encode()).hexdigest()[:32]
        client = self._task_client() if pin is None else _pinned_client(pin)
        try:
            async with file_lock(root / ".osmosis-locks" / f"{name}.lock"):
                batch = await client.download_tasks([task_id], output_dir=output_dir)
        except Exception as exc:
            secret = url is not None and _redact(url) != url  # keep credentials out of tracebacks too
            text = _describe_fetch_error(exc, url).replace(str(root), "<task cache>")  # no host paths
            raise fail(f"{what}: could not fetch the task: {text}") from (None if secret else exc)
        return batch.results[0]

    def _finish(self, result_path: Path, what: str, **fields: Any) -> ResolvedTask:
        path = Path(result_path).resolve()
        if not is_task_dir(path):
            raise fail(f"{what}: the fetched directory has no task.toml, so it is not a Harbor task")
        self._check(path, fields["task_id"], f"metadata[{TASK_KEY!r}]")
        return ResolvedTask(path=path, **fields)

    async def git(self, ref: str, git_url: Any, commit: Any) -> ResolvedTask:
        from harbor.models.task.id import GitTaskId

        shown = _redact(git_url) if isinstance(git_url, str) else git_url
        self._roots.check_git_url(git_url, f"metadata[{GIT_URL_KEY!r}]", shown)
        assert isinstance(git_url, str)
        if commit is not None and (not isinstance(commit, str) or not _GIT_REV.match(commit)):
            raise fail(f"metadata[{GIT_COMMIT_KEY!r}]={commit!r} is not a commit; pin the full 40-hex commit sha")
        shown_url = _redact(git_url)
        parts = relative_parts(ref, f"metadata[{TASK_KEY!r}] (the task's path inside {shown_url})")
        path = "/".join(parts)
        pinned = commit is not None and bool(_FULL_SHA.match(commit))
        what = f"git task {path!r} in {shown_url} @ {commit or 'HEAD'}"
        task_id = GitTaskId(git_url=git_url, git_commit_id=commit, path=Path(path))

        async def fetch() -> ResolvedTask:
            from harbor.constants import TASK_CACHE_DIR

            pin = await asyncio.to_thread(self._roots.pin_git_host, git_url, f"metadata[{GIT_URL_KEY!r}]", shown_url)
            result = await self._download(task_id, self.cache_dir, TASK_CACHE_DIR, what, git_url, pin)
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
                task_path,
                what,
                task_id=path,
                source="git",
                ref=ref,
                pinned=pinned,
                git_url=shown_url,
                git_commit_id=fetched,
            )

        return await self._once(("git", git_url, commit, path), fetch)

    async def package(self, ref: str) -> ResolvedTask:
        from harbor.models.task.id import PackageTaskId

        key = f"metadata[{TASK_KEY!r}]"
        name, _, version = ref.partition("@")
        version = version or "latest"
        if not _PACKAGE_NAME.match(name) or ".." in name:
            raise fail(
                f"{key}={ref!r} is neither a local path (start it with '/', './' or '../'), a package "
                f"'org/name@ref', nor a git task (set metadata[{GIT_URL_KEY!r}])"
            )
        digest, revision = bool(_DIGEST.match(version)), version.isdigit()
        if not (digest or revision or _PACKAGE_TAG.match(version)):
            raise fail(f"{key}={ref!r}: {version!r} is not a package ref; use a tag, a revision number or sha256:<hex>")
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
                result.path,
                what,
                task_id=f"{name}@{version}",
                source="package",
                ref=ref,
                pinned=pinned,
                content_hash=result.content_hash,
            )

        return await self._once(("package", name, version), fetch)
