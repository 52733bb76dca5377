"""Harbor's preparation commands, elided where they change nothing.

Before the agent and the verifier run, Harbor makes and empties its log dirs, clears stale
reward files and makes ``test.sh`` executable, each with a command in the sandbox. A sandbox
from an image with the bundle baked in starts with those dirs empty and world-writable (``contract.LAYOUT_DIRS``); until a
command runs or an upload lands there, making or emptying them, or removing stale reward
files from them, changes nothing, so those calls are answered here without a round trip.
A ``chmod +x`` of a file still staged for upload is applied to the staged copy.

What is known ready is forgotten wherever something may have changed: any command (its
effects are unknown), or an upload to an overlapping path.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from harbor.environments.base import ExecResult

from osmosis_harbor.sandbox.environment.routes import TransferRoutes
from osmosis_harbor.shim import contract

__all__ = ["REMOVE_REWARDS_COMMAND", "PreparationElider"]

# What Harbor's verifier runs to clear stale rewards (``Verifier._remove_reward_files``).
REMOVE_REWARDS_COMMAND = f"rm -f -- {contract.VERIFIER_LOGS}/reward.txt {contract.VERIFIER_LOGS}/reward.json"


def _done() -> ExecResult:
    return ExecResult(stdout="", stderr="", return_code=0)


class PreparationElider:
    """Harbor's dir preparation, skipped on dirs known fresh (see the module docstring); what
    is known ready is the router's (``routes.py``), which forgets it when anything may change."""

    def __init__(self, routes: TransferRoutes) -> None:
        self._routes = routes

    def skippable(self, dirs: Sequence[Any]) -> bool:
        """Making or emptying ``dirs`` changes nothing: each is known ready."""
        return bool(dirs) and all(self._routes.is_ready(str(d)) for d in dirs)

    async def ensure(
        self, dirs: Sequence[Any], harbor: Callable[[], Awaitable[ExecResult | None]]
    ) -> ExecResult | None:
        """Harbor's ``ensure_dirs`` (``harbor``), unless each dir is known ready."""
        if self.skippable(dirs):
            return _done()
        with self._routes.scoped(dirs):
            return await harbor()

    async def empty(
        self,
        dirs: Sequence[Any],
        chmod: bool,
        harbor: Callable[[], Awaitable[ExecResult | None]],
        command: str | None,
    ) -> ExecResult | None:
        """Harbor's ``empty_dirs`` (``harbor``), unless each dir is known ready; after it (with
        its chmod), they are. Its POSIX ``command`` (None on Windows) is first offered to the
        router, to run with the next upload (``ArchiveTransfers.stage_preparation``): no call."""
        if self.skippable(dirs):
            return _done()
        if command is not None and self._routes.stage_preparation(command, [str(d) for d in dirs]):
            result: ExecResult | None = _done()  # rides the next put
        else:
            with self._routes.scoped(dirs):
                result = await harbor()
        if result is not None and result.return_code == 0 and chmod:
            self._routes.mark_ready(dirs)
        return result

    def skips(self, command: str, user: str | int | None) -> bool:
        """Harbor's verifier clears stale reward files, and makes test.sh executable, with
        commands of these exact shapes; on a known-fresh dir or a staged file, they are no-ops."""
        if user not in ("root", 0):
            return False
        if command == REMOVE_REWARDS_COMMAND and self._routes.is_ready(contract.VERIFIER_LOGS):
            return True
        if command.startswith("chmod +x "):
            target = shlex.split(command)[2:]
            return len(target) == 1 and self._routes.make_executable(target[0])
        return False
