"""The separate verifier's sandbox, created while the agent still runs: a head start.

Why: a graded rollout's grader runs in a fresh sandbox of its own (``tasks.verifier.
isolate_verifier``), which Harbor creates only after the agent phase ends, so its create (a
container start locally; scheduling and an image pull on SkyPilot without a pool) is a serial
wait in every graded rollout. The verifier's sandbox needs nothing from the agent to be created:
its image and shape are the task's, decided before the agent starts. So, once the agent's
sandbox is up, the same create is made for the verifier's sandbox in the background, and the
verifier environment takes that sandbox instead of creating one.

Why this keeps the reward the grader's (docs/threat-model.md, "What a workflow can and cannot do to its
reward"): the head-started sandbox is made by the host, from the host's image and create options,
before the workflow has produced anything; the workflow gets no handle, name or credential of
it, and sandboxes cannot reach each other (SkyPilot's isolation; the Docker bridge's
inter-container traffic is off), so being alive earlier gives the workflow no channel to it.
Nothing is written into it until Harbor's verifier phase, after the agent's sandbox was stopped,
uploads the agent's products as data, exactly as into a sandbox created at that moment. One
preparation runs early: the agent's working directory, where the verifier will upload the
agent's copy, is emptied with Harbor's own command as soon as the sandbox is up (the verifier
would run that command first thing), and the verifier knows it ready, so it skips the call;
anything that may have changed it since (a command, an upload there) makes it unknown again. The
verifier takes it only if it asks for exactly the create options it was made with (image,
resources, network, environment); otherwise it is terminated and the verifier creates its own.

A head start nobody takes (the workflow failed, the trial was cancelled) is terminated when
the trial ends (``HeadStart.close``); it lives in the trial's scope (``context.trial_scope``). Its create runs inside the submitter's start bound, so it
counts as a start like any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

__all__ = ["HeadStart", "VERIFIER_SESSION_MARK"]

log = logging.getLogger(__name__)

# In a separate verifier environment's session id (Harbor's
# ``Trial._separate_verifier_session_id``: ``{trial}__verifier__{key}``).
VERIFIER_SESSION_MARK = "__verifier__"

# (the sandbox's name, its handle, the dirs made ready in it: existing, empty and 0777, as
# Harbor's ``empty_dirs`` leaves them, so the verifier's own emptying of them is elided)
Created = tuple[str, Any, frozenset[str]]


class HeadStart:
    """One trial's head-started verifier sandbox: begun by the agent's environment, taken by the
    verifier's, closed by whoever submitted the trial."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Created] | None = None
        self._agent_session = ""
        self._shape: Hashable = None
        self._end: Callable[[str], Awaitable[Any]] | None = None
        self._settled = False  # taken, or closed: never handed out twice

    @property
    def begun(self) -> bool:
        return self._task is not None

    def begin(
        self,
        agent_session: str,
        shape: Hashable,
        create: Callable[[], Awaitable[Created]],
        end: Callable[[str], Awaitable[Any]],
    ) -> None:
        """Start ``create`` in the background (once per trial). ``create`` registers what it
        makes with the owner (and cleans up after itself when it fails); ``end`` terminates it."""
        if self._task is not None or self._settled:
            return
        self._agent_session, self._shape, self._end = agent_session, shape, end
        self._task = asyncio.get_running_loop().create_task(_completed(create))

    @property
    def free(self) -> bool:
        """Begun, and neither taken nor closed yet."""
        return self._task is not None and not self._settled

    async def take(self, shape: Hashable) -> Created | None:
        """The head-started sandbox for this trial's separate verifier (only its environment asks:
        the role is the trial context's), or None: create as usual (no head start, its create
        failed, or it was made for other create options)."""
        if not self.free:
            return None
        if shape != self._shape:
            log.debug("verifier head start not used: created for other options than the verifier asks for")
            await self.close()
            return None
        self._settled = True
        assert self._task is not None
        try:
            return await asyncio.shield(self._task)
        except Exception as exc:  # the create cleaned up after itself: create again, as usual
            log.debug("verifier head start failed (%s): creating the verifier's sandbox now", exc)
            return None

    async def close(self) -> None:
        """Terminate the head start if nobody took it (idempotent)."""
        if self._settled or self._task is None:
            self._settled = True
            return
        self._settled = True
        task = self._task
        done, _ = await asyncio.wait({task})  # a create is finished, never abandoned half-way
        if task.cancelled() or task.exception() is not None or self._end is None:
            return
        name = task.result()[0]
        await self._end(name)


async def _completed(create: Callable[[], Awaitable[Created]]) -> Created:
    return await create()
