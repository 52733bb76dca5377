"""Where a request may point on this host: the allowed task roots and the trials directories.

A rollout request names its task, and a request is not the operator: a local ``harbor_task``
must resolve (symlinks included) inside ``tasks_dir`` or a root the operator listed
(``task_roots=``), and never inside a trials directory, where sandboxes write, even when an
allowed root contains it. Git refs to this machine's own repositories (``file://`` URLs and
bare paths) need ``allow_local_git=True``, and remote ones whose host is not public need
``allow_private_git_hosts=True`` (``git_hosts``). Every refusal names the request's value as
given, never the resolved host path, so an error message does not map the host for its reader.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from osmosis_harbor.tasks.git_hosts import GitPin, parse_git_remote, pin_git_host
from osmosis_harbor.tasks.refs import fail

__all__ = ["TaskRoots", "local_git_path"]

_LOCAL_GIT_URL = re.compile(r"^(?:file://(?:localhost)?(/\S*)|(/\S*))$")


def local_git_path(url: str) -> Path | None:
    """The host path a ``file://`` URL or an absolute bare path names; None for anything else."""
    match = _LOCAL_GIT_URL.match(url)
    if match is None:
        return None
    return Path(match.group(1) or match.group(2))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class TaskRoots:
    """The allowed roots of local task refs, and the directories no ref may reach.

    ``forbidden`` is asked on every check (a backend's trials directory is made lazily), and
    what it returns is resolved then, so a symlinked trials directory is caught too.
    """

    def __init__(
        self,
        allowed: Sequence[Path],
        forbidden: Callable[[], Iterable[Path]] | None = None,
        *,
        allow_local_git: bool = False,
        allow_private_git_hosts: bool = False,
    ) -> None:
        self.allowed = tuple(dict.fromkeys(Path(os.path.realpath(p)) for p in allowed))
        self.allow_local_git = allow_local_git
        self.allow_private_git_hosts = allow_private_git_hosts
        self._forbidden = forbidden or (lambda: ())

    def forbidden_dirs(self) -> list[Path]:
        return [Path(os.path.realpath(p)) for p in self._forbidden()]

    def in_trials_dir(self, real: Path) -> bool:
        return any(_within(real, trials) for trials in self.forbidden_dirs())

    def check_local(self, real: Path, key: str, shown: str) -> None:
        """Refuse a resolved local task path outside the allowed roots or inside a trials dir."""
        if not any(_within(real, root) for root in self.allowed):
            raise fail(
                f"{key}={shown!r} is outside tasks_dir and the allowed task roots (symlinks are "
                "followed); list its directory in task_roots= or OSMOSIS_HARBOR_TASK_ROOTS"
            )
        self.check_not_trials(real, key, shown)

    def check_not_trials(self, real: Path, key: str, shown: str) -> None:
        if self.in_trials_dir(real):
            raise fail(
                f"{key}={shown!r} points into a trials directory, which sandboxes write: it is never a task source"
            )

    def check_git_url(self, url: object, key: str, shown: object) -> None:
        """Refuse a git URL that is neither remote nor (when allowed) a local repository."""
        hint = "use an https://, ssh:// or git@host:path URL"
        if not isinstance(url, str) or url.startswith("-"):
            raise fail(f"{key}={shown!r} is not a git URL; {hint}")
        if parse_git_remote(url) is not None:
            return
        local = local_git_path(url)
        if local is None:
            raise fail(f"{key}={shown!r} is not a git URL; {hint}")
        if not self.allow_local_git:
            raise fail(
                f"{key}={shown!r} is a repository on this machine, and local git refs are off; {hint}, "
                "or enable them with allow_local_git=True (OSMOSIS_HARBOR_ALLOW_LOCAL_GIT=1)"
            )
        self.check_not_trials(Path(os.path.realpath(local)), key, str(shown))

    def pin_git_host(self, url: str, key: str, shown: str) -> GitPin | None:
        """The addresses git must connect to for a checked remote ``url`` (None: a local
        repository, or private hosts allowed, so git resolves as it will). Resolves the host:
        call it off the event loop."""
        remote = parse_git_remote(url)
        if remote is None or self.allow_private_git_hosts:
            return None
        return pin_git_host(remote, key, shown)
