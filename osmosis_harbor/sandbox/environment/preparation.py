"""Harbor's preparation commands, elided where they change nothing.

A mixin of ``SandboxEnvironment`` (``sandbox_environment.py``). Before the agent and the verifier
run, Harbor makes and empties its log dirs, clears stale reward files and makes ``test.sh``
executable, each with a command in the sandbox. A sandbox from an image with the bundle
baked in starts with those dirs empty and world-writable (``contract.LAYOUT_DIRS``); until a
command runs or an upload lands there, making or emptying them, or removing stale reward
files from them, changes nothing, so those calls are answered here without a round trip.
A ``chmod +x`` of a file still staged for upload is applied to the staged copy.

What is known ready is forgotten wherever something may have changed: any command (its
effects are unknown), or an upload to an overlapping path.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Sequence
from typing import Any, override

from harbor.environments.base import ExecResult
from harbor.environments.skypilot import SkypilotEnvironment

from osmosis_harbor.sandbox.transfer.archives import ArchiveTransfers, overlaps
from osmosis_harbor.shim import contract

__all__ = ["REMOVE_REWARDS_COMMAND", "PreparationElisions"]

# What Harbor's verifier runs to clear stale rewards (``Verifier._remove_reward_files``).
REMOVE_REWARDS_COMMAND = f"rm -f -- {contract.VERIFIER_LOGS}/reward.txt {contract.VERIFIER_LOGS}/reward.json"


class PreparationElisions(SkypilotEnvironment):
    """Harbor's dir preparation, skipped on dirs known fresh (see the module docstring)."""

    _known_ready: set[str]  # dirs known to exist, empty and 0777 (see _skippable)
    _scope: list[str] | None  # the paths the running preparation command touches
    _archive_transfers: ArchiveTransfers | None

    def _forget_ready(self, paths: Sequence[str] | None) -> None:
        """Something changed at ``paths`` (anywhere, when None): the known-ready dirs there
        are known no more."""
        if paths is None:
            self._known_ready.clear()
        else:
            self._known_ready = {d for d in self._known_ready if not any(overlaps(d, str(p)) for p in paths)}

    @contextlib.contextmanager
    def _prepare(self, paths: list[str]) -> Iterator[None]:
        """Mark the commands inside as touching only ``paths`` (Harbor's dir preparation)."""
        self._scope = [str(p) for p in paths]
        try:
            yield
        finally:
            self._scope = None

    def _skippable(self, dirs: Sequence[Any]) -> bool:
        return bool(dirs) and all(str(d) in self._known_ready for d in dirs)

    @override
    async def ensure_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        if self._skippable(dirs):
            return ExecResult(stdout="", stderr="", return_code=0)
        with self._prepare(list(dirs)):
            return await super().ensure_dirs(dirs, chmod=chmod)

    @override
    async def empty_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        if self._skippable(dirs):
            return ExecResult(stdout="", stderr="", return_code=0)
        with self._prepare(list(dirs)):
            result = await super().empty_dirs(dirs, chmod=chmod)
        if result is not None and result.return_code == 0 and chmod:
            self._known_ready.update(str(d) for d in dirs)
        return result

    def _skip_preparation(self, command: str, user: str | int | None) -> bool:
        """Harbor's verifier clears stale reward files, and makes test.sh executable, with
        commands of these exact shapes; on a known-fresh dir or a staged file, they are no-ops."""
        if user not in ("root", 0):
            return False
        if command == REMOVE_REWARDS_COMMAND and contract.VERIFIER_LOGS in self._known_ready:
            return True
        if command.startswith("chmod +x ") and self._archive_transfers is not None:
            target = shlex.split(command)[2:]
            return len(target) == 1 and self._archive_transfers.make_executable(target[0])
        return False
