"""Harbor's ``TaskClient`` with git run in an environment of our choosing: the pinned host.

Harbor's git task download runs ``git clone`` / ``fetch`` / ``checkout`` through two private
helpers that inherit this process's environment; ours pass a ``GitPin``'s environment instead,
so that git connects only to the addresses the request's host was checked at (``git_hosts``),
and no other fetch in this process is affected. git-lfs is refused on such a fetch: its
downloads go wherever the repository's LFS server says, unchecked. Each overridden name is in
``harbor_compat/surface.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from harbor.tasks.client import TaskClient

from osmosis_harbor import settings
from osmosis_harbor.tasks.git_hosts import GitPin
from osmosis_harbor.tasks.refs import fail

__all__ = ["PinnedTaskClient"]


class PinnedTaskClient(TaskClient):
    """A ``TaskClient`` for one git download whose git commands connect only as ``pin`` says."""

    def __init__(self, pin: GitPin) -> None:
        self._env = pin.environment(settings.child_environment())

    async def _run_git(self, *args: str | Path, cwd: Path | None = None, input: bytes | None = None) -> None:
        await self._git(args, cwd, input)

    async def _run_git_stdout(self, *args: str | Path, cwd: Path | None = None) -> str:
        return (await self._git(args, cwd, None)).decode("utf-8").strip()

    async def _pull_lfs_files(self, repo_dir: Path, task_download_configs: list[Any]) -> None:
        attributes = repo_dir / ".gitattributes"
        if (
            attributes.is_file()
            and not attributes.is_symlink()
            and "filter=lfs" in attributes.read_text(errors="replace")
        ):
            raise fail(
                "the repository uses git-lfs, whose downloads may go to any address: refused for a request's "
                "git_url unless allow_private_git_hosts=True"
            )

    async def _git(self, args: tuple[str | Path, ...], cwd: Path | None, input: bytes | None) -> bytes:
        """Harbor's git call (argv, cwd, stdin; CalledProcessError on failure), in our environment."""
        process = await asyncio.create_subprocess_exec(
            *[str(a) for a in args],
            stdin=asyncio.subprocess.PIPE if input else None,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=self._env,
        )
        stdout, stderr = await process.communicate(input=input)
        if process.returncode:
            raise subprocess.CalledProcessError(process.returncode, [str(a) for a in args], stdout, stderr)
        return stdout
