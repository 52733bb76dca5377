"""The one trial context: who owns what a trial makes, and what one trial carries, found by the
code Harbor runs through one ``ContextVar``; beside it the project's only other ``ContextVar``,
admission's place (``carry_admission_place``), so that all ambient state lives in this module.

An owner is a backend, a validation run or a command (``sandbox-check``, ``prewarm``): it holds
its sandboxes and pools (``OwnedSandboxes``), its start bound and batch claims
(``SandboxStarts``), its rollouts' credentials and its image builds. Harbor constructs our
environments and agents itself, so the owner cannot be passed down: it opens ``owner_scope``
around the trials it submits, and everything they run finds it here. A trial's own state (its
deferred terminations, its sandbox losses, its verifier head start) rides in the same variable
(``trial_scope``), and so does its verifier guard (``guard_scope``).

An environment reads all of it once, when Harbor makes it (``TrialContext.of``): from then on
it carries a `TrialContext` value (owner, credentials, role, guard, head start, loss sink) and
hands its collaborators the parts they need. Whether a sandbox is the agent's or the verifier's
(``Role``) is decided there, once, from the session id Harbor gave the environment.

There is no process-wide owner: a call that needs one outside every scope raises
``NoOwnerError``, since what it made would belong to nobody and nobody would remove it. The one
exception is an environment Harbor's own CLI makes (``harbor run -e ...``, no backend): it owns
itself (`TrialContext.of` makes a private owner, which its environment closes at ``stop``).

Admission's place (``backend/reservations.py``) rides the same way for the same reason: the
osmosis server calls ``has_capacity()`` in the admission's task and then starts the rollout's
task, passing nothing from one to the other; a task copies the context it is created in, so the
place ``has_capacity()`` left there reaches that rollout's ``execute()``, and the ended admission
finds the tasks it left running by their context (``admission_place(task)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from harbor.trial.hooks import TrialEvent, TrialHookEvent

from osmosis_harbor.credentials import CredentialStore
from osmosis_harbor.errors import NoOwnerError, SandboxLostError
from osmosis_harbor.sandbox.guard.session import GuardSession
from osmosis_harbor.sandbox.images.builds import ImageBuildCoordinator
from osmosis_harbor.sandbox.ledger.store import Ledger
from osmosis_harbor.sandbox.owner.head_start import VERIFIER_SESSION_MARK, HeadStart
from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.settings import Settings

__all__ = [
    "Role",
    "SandboxOwner",
    "TrialContext",
    "TrialScope",
    "add_guard_hooks",
    "admission_place",
    "carry_admission_place",
    "current_guard",
    "current_owner",
    "current_trial",
    "guard_scope",
    "owner_if_any",
    "owner_scope",
    "settle",
    "trial_scope",
]


# How long an owner's close waits for terminations still under way before its sweep takes over
# (each is bounded by its own retries; this only keeps a hung SDK call from holding a shutdown).
CLOSE_SETTLE_SEC = 120.0


@dataclass(eq=False)
class SandboxOwner:
    """Everything one backend, validation run or command owns (``make`` builds one)."""

    label: str
    sandboxes: OwnedSandboxes
    starts: SandboxStarts | None = None  # None: sandbox starts are unbounded
    credentials: CredentialStore = field(default_factory=CredentialStore)
    builds: ImageBuildCoordinator = field(default_factory=ImageBuildCoordinator)
    # Terminations left to run after their trial's result was reported (``settle_later``).
    _ending: set[asyncio.Future[Any]] = field(default_factory=set, repr=False)

    @classmethod
    def make(
        cls, label: str, *, config: Settings, starts: SandboxStarts | None = None, ledger: Ledger | None = None
    ) -> SandboxOwner:
        """A new owner, ``label`` saying who it is in errors and logs (``"backend"``); ``config``
        is its maker's settings (the ledger, each SDK's endpoint, the retries of its calls)."""
        user = f"{label.replace(' ', '-')[:24]}-{uuid.uuid4().hex[:12]}"
        return cls(label=label, sandboxes=OwnedSandboxes(ledger, user=user, config=config), starts=starts)

    async def close(self) -> list[str]:
        """The owner's final sweep: the terminations still under way first (bounded), then every
        sandbox it still has; returns what could not go."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settled(), CLOSE_SETTLE_SEC)
        return await self.sandboxes.terminate_all()

    def settle_later(self, *endings: Awaitable[Any]) -> None:
        """Let a finished trial's terminations (its deferred ones, an untaken head start's) end
        after its result is reported: a rollout's outcome does not wait for its sandboxes to go.
        The owner holds them until they end (a failed one is retried and kept in the ledger by
        ``OwnedSandboxes.end``), ``settled`` waits for them, and ``close`` does before its sweep."""
        for ending in endings:
            task = asyncio.ensure_future(ending)
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    async def settled(self) -> None:
        """Wait until every termination handed to ``settle_later`` has ended.

        Only the endings still running are waited for; one already done goes here, not only by
        its done callback. A done one left in the set made this a busy loop that no timeout ended
        (a gather of done futures returns at once, and ``close``'s bound never fired): a backend's
        shutdown spun for ten minutes on the loop's thread."""
        while True:
            for ending in [e for e in self._ending if e.done()]:
                self._ending.discard(ending)
                if not ending.cancelled():
                    ending.exception()  # retrieved: a failed termination is kept by the ledger, not logged here
            if not self._ending:
                return
            await asyncio.wait(list(self._ending))


@dataclass(frozen=True)
class TrialScope:
    """One trial's state: the terminations it deferred (its owner's ``settle_later`` takes
    them once the trial has a result; ``settle`` waits for them when it is cancelled), the
    losses of its sandboxes (``backend.losses`` reads them), its verifier's head start."""

    terminations: list[asyncio.Task[None]] = field(default_factory=list)
    losses: list[SandboxLostError] = field(default_factory=list)
    head_start: HeadStart | None = None

    def record_loss(self, loss: SandboxLostError) -> None:
        """A sandbox of this trial was lost: Harbor may wrap or swallow the raise, so the
        backend reads the trial's losses too."""
        self.losses.append(loss)

    def defer(self, termination: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Run ``termination()`` in the background, so the trial's queue slot frees while its
        sandbox goes (its owner settles it once the trial has a result)."""

        async def run() -> None:
            await termination()

        self.terminations.append(asyncio.ensure_future(run()))


class Role(StrEnum):
    """Whose sandbox an environment's is: a trial's agent's, or its separate verifier's."""

    AGENT = "agent"
    VERIFIER = "verifier"

    @classmethod
    def of_session(cls, session_id: str) -> Role:
        """Decided from the session id Harbor gave the environment (a separate verifier's is
        ``{trial}__verifier__{key}``), never from a sandbox's name."""
        return cls.VERIFIER if VERIFIER_SESSION_MARK in session_id else cls.AGENT


@dataclass(frozen=True)
class _Scope:
    owner: SandboxOwner | None
    trial: TrialScope | None = None
    guard: GuardSession | None = None


_CURRENT: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("osmosis_harbor_trial", default=None)

# Admission's place (``backend/reservations.py``): the server starts the rollout's task after
# ``has_capacity()`` and passes nothing along, but the task copies the admission's context.
_ADMISSION_PLACE: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "osmosis_harbor_admission_place", default=None
)


@dataclass(frozen=True)
class TrialContext:
    """What one environment of a trial carries, read once when Harbor makes it (`of`)."""

    owner: SandboxOwner
    owns_itself: bool  # made outside every owner (Harbor's CLI): it closes its owner at stop
    role: Role
    trial: TrialScope | None = None  # None: no trial scope (a check, a tool): nothing deferred
    guard: GuardSession | None = None  # the verifier guard of an agent's sandbox, if guarded

    @classmethod
    def of(cls, session_id: str, label: str, config: Settings) -> TrialContext:
        """The one ambient lookup (Harbor constructs the environment, so nothing can be passed):
        the submitter's owner, trial and guard; made by Harbor's CLI, an owner of its own, with
        the environment's settings (``config``)."""
        scope = _CURRENT.get() or _Scope(None)
        role = Role.of_session(session_id)
        guard = scope.guard if role is Role.AGENT else None  # a separate verifier's needs none
        if scope.owner is None:
            return cls(SandboxOwner.make(label, config=config), True, role, scope.trial, guard)
        return cls(scope.owner, False, role, scope.trial, guard)

    @property
    def credentials(self) -> CredentialStore:
        return self.owner.credentials

    @property
    def head_start(self) -> HeadStart | None:
        return self.trial.head_start if self.trial is not None else None

    def record_loss(self, loss: SandboxLostError) -> None:
        """The loss sink: the trial (if any) is told its sandbox was lost."""
        if self.trial is not None:
            self.trial.record_loss(loss)

    def defer_termination(self, termination: Callable[[], Coroutine[Any, Any, Any]]) -> bool:
        """In the background inside a trial (False: no trial, run it yourself)."""
        if self.trial is None:
            return False
        self.trial.defer(termination)
        return True


@contextlib.contextmanager
def owner_scope(owner: SandboxOwner) -> Iterator[SandboxOwner]:
    """What is made in this context (and the tasks it spawns) belongs to ``owner``."""
    token = _CURRENT.set(_Scope(owner))
    try:
        yield owner
    finally:
        _CURRENT.reset(token)


def current_owner(call: str) -> SandboxOwner:
    """The owner of the code running here; ``call`` names what needs it, for the error."""
    scope = _CURRENT.get()
    if scope is None or scope.owner is None:
        raise NoOwnerError(call)
    return scope.owner


def owner_if_any() -> SandboxOwner | None:
    """The owner of the code running here, if any."""
    scope = _CURRENT.get()
    return None if scope is None else scope.owner


@contextlib.contextmanager
def trial_scope(*, head_start: bool = False, guard: GuardSession | None = None) -> Iterator[TrialScope]:
    """One trial's scope inside its owner's (the trial's task inherits it); ``head_start``:
    its separate verifier's sandbox is created while the agent runs (``head_start.py``);
    ``guard``: its agent's sandbox is guarded (``guard/session.py``)."""
    scope = _CURRENT.get()
    if scope is None or scope.owner is None:
        raise NoOwnerError("a trial's scope")
    trial = TrialScope(head_start=HeadStart() if head_start else None)
    token = _CURRENT.set(replace(scope, trial=trial, guard=guard))
    try:
        yield trial
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def guard_scope(session: GuardSession | None) -> Iterator[GuardSession | None]:
    """``session`` guards the trial submitted inside (its task inherits the scope); None: unguarded."""
    token = _CURRENT.set(replace(_CURRENT.get() or _Scope(None), guard=session))
    try:
        yield session
    finally:
        _CURRENT.reset(token)


def current_trial() -> TrialScope | None:
    """The scope of the trial running here, if its owner opened one."""
    scope = _CURRENT.get()
    return None if scope is None else scope.trial


def current_guard() -> GuardSession | None:
    """The verifier guard of the trial running here, if it is guarded."""
    scope = _CURRENT.get()
    return None if scope is None else scope.guard


def carry_admission_place(place: object) -> None:
    """Leave ``place`` in the running code's context (not reset: the admission that asked keeps
    it, and so does every task it starts from now on, the rollout's among them)."""
    _ADMISSION_PLACE.set(place)


def admission_place(task: asyncio.Task[Any] | None = None) -> object | None:
    """The admission place the running code carries, or ``task`` (its context, Python 3.12)."""
    if task is None:
        return _ADMISSION_PLACE.get()
    return task.get_context().get(_ADMISSION_PLACE)


async def _agent_started(_event: TrialHookEvent) -> None:
    if (session := current_guard()) is not None:
        session.agent_starts()


async def _verification_started(_event: TrialHookEvent) -> None:
    if (session := current_guard()) is not None:
        session.verification_starts()


def add_guard_hooks(queue: Any) -> None:
    """Make ``queue``'s trials tell their guard where the agent phase and verification begin
    (Harbor emits the hooks in the trial's own task, where its scope is visible). Adding them
    twice is harmless: each move is made once."""
    queue.add_hook(TrialEvent.AGENT_START, _agent_started)
    queue.add_hook(TrialEvent.VERIFICATION_START, _verification_started)


async def settle(pending: list[asyncio.Task[None]]) -> None:
    """Wait for deferred terminations, even if the waiter is cancelled meanwhile."""
    while pending:
        batch = list(pending)
        pending.clear()
        gathered = asyncio.gather(*batch, return_exceptions=True)
        try:
            await asyncio.shield(gathered)
        except asyncio.CancelledError:
            await gathered
            raise
