"""One rollout's trial through the user's ``TrialQueue``, and again after a lost sandbox.

``TrialRunner.run`` holds the trial directory in key custody from before the trial starts
until it is scrubbed (``osmosis_harbor.keys``), submits the trial, runs it again on a fresh
sandbox when the infrastructure failed the first one (a lost sandbox, or the policy relay
refusing the rollout's calls through no fault of its own: ``sandbox.relay.refusals``; at most
``infra_retries`` times, never after a workflow's own failure), and reads the last trial into
the rollout's ``ExecutionOutcome``.
A trial reaches the queue only while its rollout holds a slot of the backend's ``TrialGate``
(retries first), and its sandbox starts inside the backend's start bound (``sandbox.starts``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harbor.models.trial.config import TrialConfig
from harbor.models.trial.result import TrialResult
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import (
    ExecutionOutcome,
    ExecutionRequest,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
)

from osmosis_harbor import settings
from osmosis_harbor.agents.native import sample_from_trajectory
from osmosis_harbor.agents.workflow import agent_timeout_budget
from osmosis_harbor.backend.gate import Lease, Priority, TrialGate
from osmosis_harbor.backend.losses import recognise_loss
from osmosis_harbor.backend.outcome import (
    build_outcome,
    cancelled,
    lost_sandbox_message,
    refused,
)
from osmosis_harbor.backend.plan import RolloutPlan
from osmosis_harbor.backend.tracker import RolloutState, RolloutTracker
from osmosis_harbor.errors import SandboxLostError
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.keys import KeyCustody
from osmosis_harbor.sandbox.guard import GuardSession
from osmosis_harbor.sandbox.owner.context import SandboxOwner, current_owner, settle, trial_scope
from osmosis_harbor.sandbox.relay.refusals import RelayRecord
from osmosis_harbor.trials.export import export_rollout_files
from osmosis_harbor.trials.naming import trial_name as make_trial_name

__all__ = ["Attempt", "TrialRunner"]


@dataclass(frozen=True)
class Attempt:
    """A rollout ready to run: its request, plan and first trial's config."""

    request: ExecutionRequest
    plan: RolloutPlan
    config: TrialConfig
    key: str | None
    native_agent: str | None  # the native agent's name; None for a workflow bundle
    relay: RelayRecord | None = None  # what the policy relay refused of the rollout's calls, if relayed

    @property
    def trial_dir(self) -> Path:
        return self.config.trials_dir / self.config.trial_name


@dataclass(frozen=True)
class _Turn:
    """One attempt's place in the backend's ``TrialGate``."""

    lease: Lease
    priority: Priority
    retry_left: bool  # an infrastructure failure would be retried
    relay: RelayRecord | None


def _infra_failure(
    result: TrialResult | ExecutionOutcome, relay: RelayRecord | None, overrides: Mapping[str, Any]
) -> tuple[str, str] | None:
    """Why the infrastructure failed this trial, as (the outcome's extra key, the reason): a
    lost sandbox (unless the user's ``override_error_policy`` says its type is not retried), or
    the relay refusing a call of the rollout that it never recovered from."""
    if isinstance(result, ExecutionOutcome):
        return None
    if (lost := lost_sandbox_message(result)) is not None:
        info = result.exception_info
        if info is not None and not error_policies.retry_allowed(info.exception_type, overrides):
            return None
        return "lost_sandboxes", lost
    failure = relay.report().failure_message() if relay is not None else None
    return ("relay_failures", failure) if failure is not None else None


def _head_start(attempt: Attempt) -> bool:
    """A single-step trial whose verifier runs in a sandbox of its own (the grader's, or a fresh
    one for the task's tests): start it early (``sandbox.head_start``) unless
    ``OSMOSIS_HARBOR_VERIFIER_HEAD_START=0``."""
    plan = attempt.plan
    return plan.verifier_sandbox and len(plan.steps) <= 1 and settings.current().verifier_head_start


class TrialRunner:
    """Submits rollouts' trials and turns them into outcomes."""

    def __init__(
        self,
        orchestrator: TrialQueue,
        tracker: RolloutTracker,
        custody: KeyCustody,
        *,
        infra_retries: int,
        gate: TrialGate,
        error_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.tracker = tracker
        self.custody = custody
        self.infra_retries = infra_retries
        self.gate = gate
        self.error_overrides = dict(error_overrides or {})

    async def run(self, attempt: Attempt, *, cleanup_success: bool) -> ExecutionOutcome:
        request, trial_dir = attempt.request, attempt.trial_dir
        extra: dict[str, Any] = {"task_id": attempt.plan.task.task_id, "trial_name": attempt.config.trial_name}
        succeeded = False
        try:
            # From here until sealed, the trial directory may receive the key (see keys.py).
            await asyncio.to_thread(self.custody.hold, trial_dir, attempt.key)
            self.tracker.bind_trial(request.id, attempt.config.trial_name, attempt.plan.task.task_id)
            state = self.tracker.get(request.id)
            if state is not None and state.cancel_requested:
                return cancelled(extra)
            result, trial_dir, extra, guard = await self._attempts(attempt, trial_dir, state, extra)
            if isinstance(result, ExecutionOutcome):
                return result
            if await asyncio.to_thread(self.custody.seal, trial_dir):  # before anything reads the trial
                extra = {**extra, "trial_dir_removed": "the trial could not be scrubbed of the API key"}
            # The trial dir holds what the sandbox wrote: read it off the event loop.
            outcome = await asyncio.to_thread(self._outcome, attempt, result, trial_dir, extra, guard)
            succeeded = outcome.result.status is RolloutStatus.SUCCESS
            return outcome
        finally:  # every other ending too: cancelled, refused, our own task cancelled
            await asyncio.to_thread(self._close_trial, trial_dir, succeeded and cleanup_success, attempt)

    def _close_trial(self, trial_dir: Path, remove: bool, exported: Attempt | None = None) -> None:
        """Seal the trial directory; copy ``exported``'s files to the platform's artifact root
        from it (``trials.export``), then remove it when asked."""
        self.custody.seal(trial_dir)  # a no-op when already sealed
        if exported is not None:
            export_rollout_files(trial_dir, exported.request.id, exported.plan.steps)
        if remove:
            shutil.rmtree(trial_dir, True)

    async def _attempts(
        self, attempt: Attempt, trial_dir: Path, state: RolloutState | None, extra: dict[str, Any]
    ) -> tuple[TrialResult | ExecutionOutcome, Path, dict[str, Any], GuardSession | None]:
        """Run the trial, and again on a fresh sandbox after each infrastructure failure.
        Returns the last result (or the outcome that ended the rollout), its trial directory,
        the extra fields recording the attempts, and the last attempt's verifier guard (None
        when its tests do not run in the agent's sandbox)."""
        failed: dict[str, list[dict[str, str]]] = {}
        retries = 0
        config = attempt.config
        lease = self.gate.lease()  # the rollout's place in line, kept by its retries
        priority = Priority.FIRST_ATTEMPT
        try:
            while True:
                if attempt.relay is not None:
                    attempt.relay.clear()  # this attempt's calls only
                turn = _Turn(lease, priority, retries < self.infra_retries, attempt.relay)
                guard = GuardSession(attempt.plan.guard) if attempt.plan.guard is not None else None
                result = await self._submit(config, state, extra, turn, head_start=_head_start(attempt), guard=guard)
                failure = _infra_failure(result, attempt.relay, self.error_overrides)
                if failure is None or retries >= self.infra_retries:
                    break
                retries += 1
                failed.setdefault(failure[0], []).append({"trial_name": config.trial_name, "error": failure[1]})
                if state is not None and state.cancel_requested:  # cancelled between attempts
                    await asyncio.to_thread(shutil.rmtree, trial_dir, True)
                    return cancelled({**extra, **failed}), trial_dir, extra, None
                config, trial_dir = await self._fresh_attempt(attempt, config, trial_dir)
                extra = {**extra, "trial_name": config.trial_name}
                priority = Priority.RETRY  # the lease was requeued as the failed trial ended
        finally:
            lease.release()
        return result, trial_dir, {**extra, "attempts": retries + 1, **failed}, guard

    async def _submit(
        self,
        config: TrialConfig,
        state: RolloutState | None,
        extra: dict[str, Any],
        turn: _Turn,
        *,
        head_start: bool = False,
        guard: GuardSession | None = None,
    ) -> TrialResult | ExecutionOutcome:
        """One trial through the user's queue: its result, or the outcome that ends the rollout
        (cancelled, or a trial Harbor could not create). Waiting for a gate slot is part of the
        trial's task, so cancelling a rollout that waits there cancels its wait. ``head_start``:
        the trial's separate verifier gets its sandbox created while the agent runs
        (``sandbox.head_start``); one nobody took is terminated before the trial counts as done."""
        # The trial's task inherits these scopes (the environments Harbor makes read them), inside
        # the backend's owner scope (``execute``).
        with trial_scope(head_start=head_start, guard=guard) as scope:
            trial = asyncio.ensure_future(self._gated(config, turn, scope.losses))
        terminations, head = scope.terminations, scope.head_start
        owner = current_owner("a trial's sandbox terminations")
        if state is not None:
            state.task = trial
        try:
            try:
                return await self._finish(trial, terminations, owner)
            finally:
                if head is not None:  # a head start nobody took goes with the trial's sandboxes
                    owner.settle_later(head.close())
        except asyncio.CancelledError:
            if not trial.done():  # our own task was cancelled: take the trial down with us
                trial.cancel()
                await asyncio.gather(trial, return_exceptions=True)
                await settle(terminations)
                raise
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return cancelled(extra)  # cancel_rollouts cancelled the trial
        except Exception as exc:  # Trial.create errors escape the queue's coroutine
            return refused(
                f"trial could not be created: {type(exc).__name__}: {exc}",
                {**extra, "failed_phase": "environment"},
                RolloutErrorCategory.INTERNAL_ERROR,
            )

    async def _gated(self, config: TrialConfig, turn: _Turn, losses: list[SandboxLostError]) -> TrialResult:
        """The trial, submitted once its rollout holds a gate slot, read as lost when one of
        its sandboxes was (``losses``, whatever Harbor recorded: ``backend.losses``). The slot
        goes back as the trial ends (its sandbox may still be terminating): to the next in
        line, or, when the infrastructure lost the sandbox and a retry follows, with the retry
        first in line."""
        lease = turn.lease
        await lease.acquire(turn.priority)
        try:
            result = recognise_loss(await self.orchestrator.submit(config), losses)
        except BaseException:
            lease.release()
            raise
        if turn.retry_left and _infra_failure(result, turn.relay, self.error_overrides) is not None:
            lease.requeue()
        else:
            lease.release()
        return result

    @staticmethod
    async def _finish(
        trial: asyncio.Future[TrialResult], terminations: list[asyncio.Task[None]], owner: SandboxOwner
    ) -> TrialResult:
        """The trial's result, as soon as it has one: the trial stops its sandboxes without
        waiting (its queue slot frees, a separate verifier starts meanwhile), and their
        terminations go on after the result, held by the owner (``settle_later``: retried, kept
        in the ledger, waited for at shutdown). A terminate is an API call (on SkyPilot, a pod's
        deletion) that no part of the outcome depends on."""
        try:
            return await asyncio.shield(trial)
        finally:
            if trial.done():  # else we are being cancelled: the caller takes the trial down first
                owner.settle_later(*terminations)

    async def _fresh_attempt(self, attempt: Attempt, config: TrialConfig, trial_dir: Path) -> tuple[TrialConfig, Path]:
        """The next attempt after a lost sandbox: a new trial name, so a new sandbox name (the
        lost one is never reused; Harbor's stop already terminated what was left of it). The
        lost attempt's trial directory goes: only the outcome's ``lost_sandboxes`` remain."""
        await asyncio.to_thread(self._close_trial, trial_dir, True)
        name = make_trial_name(attempt.request.id, max_slug=24, fallback="rollout")
        fresh = config.trials_dir / name
        await asyncio.to_thread(self.custody.hold, fresh, attempt.key)  # the new one's custody
        self.tracker.bind_trial(attempt.request.id, name, attempt.plan.task.task_id)
        return config.model_copy(update={"trial_name": name}), fresh

    def _outcome(
        self, attempt: Attempt, result: TrialResult, trial_dir: Path, extra: dict[str, Any], guard: GuardSession | None
    ) -> ExecutionOutcome:
        request = attempt.request
        agent_sample: Any = ...
        if attempt.native_agent is not None:
            try:
                agent_sample = sample_from_trajectory(trial_dir)
            except ValueError as exc:  # a trajectory we cannot read: keep the reward, say why
                extra = {**extra, "trajectory_error": str(exc)}
                agent_sample = None
            if agent_sample is None:
                agent_sample = RolloutSample(messages=list(request.prompt))
            extra = {**extra, "native_agent": attempt.native_agent}
        return build_outcome(
            result,
            trial_dir,
            reward_source=attempt.plan.reward_source,
            label=request.label,
            base_extra=extra,
            agent_sample=agent_sample,
            agent_deadline_sec=None if attempt.native_agent else agent_timeout_budget(request.agent_timeout_sec),
            relay=attempt.relay.report() if attempt.relay is not None else None,
            guard=guard,
        )
