"""One rollout's trial through the user's ``TrialQueue``, and again after a lost sandbox.

``TrialRunner.run`` holds the trial directory in key custody from before the trial starts
until it is scrubbed (``osmosis_harbor.key_custody``), submits the trial, runs it again on a fresh
sandbox when the infrastructure failed the first one (a lost sandbox, or the policy relay
refusing the rollout's calls through no fault of its own: ``sandbox.relay.refusals``; at most
``infra_retries`` times, never after a workflow's own failure), and reads the last trial into
the rollout's ``ExecutionOutcome``.
A trial reaches the queue only while its rollout holds a slot of the backend's ``TrialGate``
(retries first), and its sandbox starts inside the backend's start bound (``sandbox.starts``).

The trial's context (its owner's trial scope and its verifier guard) is entered in one place,
``_trial_context``, and what the trial's sandboxes wrote back to it (losses, terminations, an
untaken head start) is read in ``_trial`` and ``_gated`` from the scope it yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harbor.models.trial.config import TrialConfig
from harbor.models.trial.result import TrialResult
from osmosis_ai.rollout.types import (
    ExecutionOutcome,
    ExecutionRequest,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
)

from osmosis_harbor.agents.native import sample_from_trajectory
from osmosis_harbor.agents.workflow import agent_timeout_budget
from osmosis_harbor.backend.gate import Lease, Priority, TrialGate
from osmosis_harbor.backend.losses import recognise_loss
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.outcome import build_outcome, cancelled, lost_sandbox_message, refused
from osmosis_harbor.backend.plan import RolloutPlan
from osmosis_harbor.backend.tracker import RolloutState, RolloutTracker
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.key_custody import KeyCustody
from osmosis_harbor.sandbox.guard import GuardSession
from osmosis_harbor.sandbox.owner.context import TrialScope, current_owner, settle, trial_scope
from osmosis_harbor.sandbox.relay.refusals import RelayRecord
from osmosis_harbor.trials.contract_files import ContractBounds
from osmosis_harbor.trials.export import export_rollout_files
from osmosis_harbor.trials.naming import trial_name as make_trial_name

__all__ = ["Attempt", "LastTrial", "TrialRunner"]


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
class InfraFailure:
    """Why the infrastructure failed a trial: the outcome's extra key, and the reason."""

    key: str  # "lost_sandboxes" or "relay_failures"
    reason: str


@dataclass(frozen=True)
class _Turn:
    """One attempt's place in the backend's ``TrialGate``."""

    lease: Lease
    priority: Priority
    retry_left: bool  # an infrastructure failure would be retried


@dataclass(frozen=True)
class _TrialEnd:
    """How one trial ended: its result (or the outcome that ends the rollout instead), and the
    infrastructure failure that a retry would answer, judged once."""

    result: TrialResult | ExecutionOutcome
    failure: InfraFailure | None = None


@dataclass(frozen=True)
class LastTrial:
    """What the retry loop ends with: the last trial's result (or the outcome that ended the
    rollout), its trial directory, the extra fields recording the attempts, and the last
    attempt's verifier guard (None when its tests do not run in the agent's sandbox)."""

    result: TrialResult | ExecutionOutcome
    trial_dir: Path
    extra: Mapping[str, Any] = field(default_factory=dict)
    guard: GuardSession | None = None


def infra_failure(
    result: TrialResult | ExecutionOutcome, relay: RelayRecord | None, overrides: Mapping[str, Any]
) -> InfraFailure | None:
    """Why the infrastructure failed this trial: a lost sandbox (unless the user's
    ``override_error_policy`` says its type is not retried), or the relay refusing a call of
    the rollout that it never recovered from."""
    if isinstance(result, ExecutionOutcome):
        return None
    if (lost := lost_sandbox_message(result)) is not None:
        info = result.exception_info
        if info is not None and not error_policies.retry_allowed(info.exception_type, overrides):
            return None
        return InfraFailure("lost_sandboxes", lost)
    failure = relay.report().failure_message() if relay is not None else None
    return InfraFailure("relay_failures", failure) if failure is not None else None


class TrialRunner:
    """Submits rollouts' trials and turns them into outcomes."""

    def __init__(self, options: BackendOptions, tracker: RolloutTracker, custody: KeyCustody, *, gate: TrialGate):
        self.orchestrator = options.orchestrator
        self.infra_retries = options.infra_retries
        self.error_overrides = dict(options.override_error_policy)
        self.cleanup_success = options.cleanup_successful_trials
        self.verifier_head_start = options.settings.verifier_head_start
        self.settings = options.settings
        self.contract_bounds = ContractBounds.of(options.settings)  # what trials' files are read within
        self.tracker = tracker
        self.custody = custody
        self.gate = gate

    async def run(self, attempt: Attempt) -> ExecutionOutcome:
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
            ended = await self._attempts(attempt, state, extra)
            trial_dir = ended.trial_dir
            if isinstance(ended.result, ExecutionOutcome):
                return ended.result
            if await asyncio.to_thread(self.custody.seal, trial_dir):  # before anything reads the trial
                ended = replace(
                    ended, extra={**ended.extra, "trial_dir_removed": "the trial could not be scrubbed of the API key"}
                )
            # The trial dir holds what the sandbox wrote: read it off the event loop.
            outcome = await asyncio.to_thread(self._outcome, attempt, ended)
            succeeded = outcome.result.status is RolloutStatus.SUCCESS
            return outcome
        finally:  # every other ending too: cancelled, refused, our own task cancelled
            await asyncio.to_thread(self._close_trial, trial_dir, succeeded and self.cleanup_success, attempt)

    def _close_trial(self, trial_dir: Path, remove: bool, exported: Attempt | None = None) -> None:
        """Seal the trial directory; copy ``exported``'s files to the platform's artifact root
        from it (``trials.export``), then remove it when asked."""
        self.custody.seal(trial_dir)  # a no-op when already sealed
        if exported is not None:
            export_rollout_files(trial_dir, exported.request.id, exported.plan.steps, config=self.settings)
        if remove:
            shutil.rmtree(trial_dir, True)

    async def _attempts(self, attempt: Attempt, state: RolloutState | None, extra: dict[str, Any]) -> LastTrial:
        """Run the trial, and again on a fresh sandbox after each infrastructure failure."""
        failed: dict[str, list[dict[str, str]]] = {}
        config, trial_dir = attempt.config, attempt.trial_dir
        lease = self.gate.lease()  # the rollout's place in line, kept by its retries
        priority = Priority.FIRST_ATTEMPT
        retries = 0
        try:
            while True:
                if attempt.relay is not None:
                    attempt.relay.clear()  # this attempt's calls only
                guard = GuardSession(attempt.plan.guard) if attempt.plan.guard is not None else None
                turn = _Turn(lease, priority, retries < self.infra_retries)
                end = await self._trial(attempt, config, state, extra, turn, guard)
                if end.failure is None or not turn.retry_left:
                    return LastTrial(end.result, trial_dir, {**extra, "attempts": retries + 1, **failed}, guard)
                retries += 1
                failed.setdefault(end.failure.key, []).append(
                    {"trial_name": config.trial_name, "error": end.failure.reason}
                )
                if state is not None and state.cancel_requested:  # cancelled between attempts
                    await asyncio.to_thread(shutil.rmtree, trial_dir, True)
                    return LastTrial(cancelled({**extra, **failed}), trial_dir, extra)
                config, trial_dir = await self._fresh_attempt(attempt, config, trial_dir)
                extra = {**extra, "trial_name": config.trial_name}
                priority = Priority.RETRY  # the lease was requeued as the failed trial ended
        finally:
            lease.release()

    @staticmethod
    @contextlib.contextmanager
    def _trial_context(head_start: bool, guard: GuardSession | None) -> Iterator[TrialScope]:
        """The trial's context, which the trial's task inherits (the environments Harbor makes
        read it), inside the backend's owner scope (``execute``)."""
        with trial_scope(head_start=head_start, guard=guard) as scope:
            yield scope

    async def _trial(
        self,
        attempt: Attempt,
        config: TrialConfig,
        state: RolloutState | None,
        extra: dict[str, Any],
        turn: _Turn,
        guard: GuardSession | None,
    ) -> _TrialEnd:
        """One trial through the user's queue: its result, or the outcome that ends the rollout
        (cancelled, or a trial Harbor could not create). Waiting for a gate slot is part of the
        trial's task, so cancelling a rollout that waits there cancels its wait. A single-step
        trial whose verifier has a sandbox of its own gets that sandbox created while the agent
        runs (``sandbox.head_start``); one nobody took is terminated with the trial's sandboxes.
        The sandboxes' terminations go on after the result, held by the owner (``settle_later``):
        no part of the outcome depends on them."""
        plan = attempt.plan
        head_start = plan.verifier_sandbox and len(plan.steps) <= 1 and self.verifier_head_start
        with self._trial_context(head_start, guard) as scope:
            trial = asyncio.ensure_future(self._gated(config, turn, attempt.relay, scope))
        owner = current_owner("a trial's sandbox terminations")
        if state is not None:
            state.task = trial
        try:
            try:
                return await asyncio.shield(trial)
            finally:
                if trial.done():  # else we are being cancelled: the trial is taken down below first
                    owner.settle_later(*scope.terminations)
                if scope.head_start is not None:  # a head start nobody took goes with the trial's sandboxes
                    owner.settle_later(scope.head_start.close())
        except asyncio.CancelledError:
            if not trial.done():  # our own task was cancelled: take the trial down with us
                trial.cancel()
                await asyncio.gather(trial, return_exceptions=True)
                await settle(scope.terminations)
                raise
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return _TrialEnd(cancelled(extra))  # cancel_rollouts cancelled the trial
        except Exception as exc:  # Trial.create errors escape the queue's coroutine
            return _TrialEnd(
                refused(
                    f"trial could not be created: {type(exc).__name__}: {exc}",
                    {**extra, "failed_phase": "environment"},
                    RolloutErrorCategory.INTERNAL_ERROR,
                )
            )

    async def _gated(self, config: TrialConfig, turn: _Turn, relay: RelayRecord | None, scope: TrialScope) -> _TrialEnd:
        """The trial, submitted once its rollout holds a gate slot, read as lost when one of its
        sandboxes was (the losses its context collected: ``backend.losses``). The slot goes back
        as the trial ends (its sandbox may still be terminating): to the next in line, or, when
        the infrastructure failed it and a retry follows, with the retry first in line."""
        await turn.lease.acquire(turn.priority)
        try:
            result = recognise_loss(await self.orchestrator.submit(config), scope.losses)
        except BaseException:
            turn.lease.release()
            raise
        failure = infra_failure(result, relay, self.error_overrides)
        if turn.retry_left and failure is not None:
            turn.lease.requeue()
        else:
            turn.lease.release()
        return _TrialEnd(result, failure)

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

    def _outcome(self, attempt: Attempt, ended: LastTrial) -> ExecutionOutcome:
        request, extra = attempt.request, dict(ended.extra)
        assert isinstance(ended.result, TrialResult)
        agent_sample: Any = ...
        if attempt.native_agent is not None:
            try:
                agent_sample = sample_from_trajectory(ended.trial_dir, self.contract_bounds)
            except ValueError as exc:  # a trajectory we cannot read: keep the reward, say why
                extra["trajectory_error"] = str(exc)
                agent_sample = None
            if agent_sample is None:
                agent_sample = RolloutSample(messages=list(request.prompt))
            extra["native_agent"] = attempt.native_agent
        return build_outcome(
            ended.result,
            ended.trial_dir,
            self.contract_bounds,
            reward_source=attempt.plan.reward_source,
            label=request.label,
            base_extra=extra,
            agent_sample=agent_sample,
            agent_deadline_sec=None if attempt.native_agent else agent_timeout_budget(request.agent_timeout_sec),
            relay=attempt.relay.report() if attempt.relay is not None else None,
            guard=ended.guard,
        )
