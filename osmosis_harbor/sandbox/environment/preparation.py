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

import contextlib
import shlex
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from harbor.environments.base import ExecResult

from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.transfer.archives import overlaps
from osmosis_harbor.shim import contract

__all__ = ["REMOVE_REWARDS_COMMAND", "PreparationElider"]

# What Harbor's verifier runs to clear stale rewards (``Verifier._remove_reward_files``).
REMOVE_REWARDS_COMMAND = f"rm -f -- {contract.VERIFIER_LOGS}/reward.txt {contract.VERIFIER_LOGS}/reward.json"


class PreparationElider:
    """Harbor's dir preparation, skipped on dirs known fresh (see the module docstring)."""

    def __init__(self, state: EnvironmentState) -> None:
        self._state = state
        self._defer: Callable[[list[str], bool], bool] | None = None

    def forget_ready(self, paths: Sequence[str] | None) -> None:
        """Something changed at ``paths`` (anywhere, when None): the known-ready dirs there
        are known no more."""
        state = self._state
        if paths is None:
            state.known_ready.clear()
        else:
            state.known_ready = {d for d in state.known_ready if not any(overlaps(d, str(p)) for p in paths)}

    @contextlib.contextmanager
    def scoped(self, paths: Sequence[Any]) -> Iterator[None]:
        """Mark the commands inside as touching only ``paths`` (Harbor's dir preparation)."""
        self._state.scope = [str(p) for p in paths]
        try:
            yield
        finally:
            self._state.scope = None

    def skippable(self, dirs: Sequence[Any]) -> bool:
        """Making or emptying ``dirs`` changes nothing: each is known ready."""
        return bool(dirs) and all(str(d) in self._state.known_ready for d in dirs)

    def defers_with(self, defer: Callable[[list[str], bool], bool]) -> None:
        """``empty`` hands its command to ``defer(dirs, chmod)`` first: True when it was staged
        to run with the next upload (``ArchiveTransfers.stage_preparation``), costing no call."""
        self._defer = defer

    async def ensure(
        self, dirs: Sequence[Any], harbor: Callable[[], Awaitable[ExecResult | None]]
    ) -> ExecResult | None:
        """Harbor's ``ensure_dirs`` (``harbor``), unless each dir is known ready."""
        if self.skippable(dirs):
            return ExecResult(stdout="", stderr="", return_code=0)
        with self.scoped(dirs):
            return await harbor()

    async def empty(
        self, dirs: Sequence[Any], chmod: bool, harbor: Callable[[], Awaitable[ExecResult | None]]
    ) -> ExecResult | None:
        """Harbor's ``empty_dirs`` (``harbor``), unless each dir is known ready; after it (with
        its chmod), they are."""
        if self.skippable(dirs):
            return ExecResult(stdout="", stderr="", return_code=0)
        if self._defer is not None and self._defer([str(d) for d in dirs], chmod):
            result: ExecResult | None = ExecResult(stdout="", stderr="", return_code=0)  # rides the next put
        else:
            with self.scoped(dirs):
                result = await harbor()
        if result is not None and result.return_code == 0 and chmod:
            self._state.known_ready.update(str(d) for d in dirs)
        return result

    def skips(self, command: str, user: str | int | None) -> bool:
        """Harbor's verifier clears stale reward files, and makes test.sh executable, with
        commands of these exact shapes; on a known-fresh dir or a staged file, they are no-ops."""
        if user not in ("root", 0):
            return False
        state = self._state
        if command == REMOVE_REWARDS_COMMAND and contract.VERIFIER_LOGS in state.known_ready:
            return True
        if command.startswith("chmod +x ") and state.archive_transfers is not None:
            target = shlex.split(command)[2:]
            return len(target) == 1 and state.archive_transfers.make_executable(target[0])
        return False
