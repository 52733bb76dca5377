"""``InProcessBackend``: rollouts run as Harbor trials in this process (``HarborBackend``'s job
with ``workers=1``, and each worker process's).

Per rollout: resolve the task (template or dataset mode, or a per-rollout ref), decide the
rollout's plan and copy the task for it (``plan``), submit one trial through the user's
``TrialQueue`` (``attempts``), then read the trial directory back into an ``ExecutionOutcome``
(``outcome``). The constructor does all the checking it can (bundle built, tasks dir valid) so
that a misconfigured server fails at start-up, not on its first rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.context import RolloutContext, get_rollout_context
from osmosis_ai.rollout.types import ExecutionOutcome, ExecutionRequest, RolloutErrorCategory, RolloutStatus

from osmosis_harbor.agents.native import native_agent_config, scoped_api_key
from osmosis_harbor.backend.admission import endpoint_problem, relays_endpoint, request_problem
from osmosis_harbor.backend.attempts import Attempt, TrialRunner
from osmosis_harbor.backend.construction import (
    default_environment,
    preload_model_client,
    prepared_bundle,
    reap_leftovers,
    sandbox_starts,
    task_resolver,
)
from osmosis_harbor.backend.gate import TrialGate
from osmosis_harbor.backend.leak_audits import FirstUseAudits
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.outcome import refused
from osmosis_harbor.backend.plan import Planner, Refusal, RolloutPlan
from osmosis_harbor.backend.reservations import Reservations
from osmosis_harbor.backend.serving_state import ServingState
from osmosis_harbor.backend.task_copies import TaskCopies
from osmosis_harbor.backend.tracker import TERMINAL, RolloutTracker
from osmosis_harbor.backend.workspace import Workspace
from osmosis_harbor.bundle import BundleInfo
from osmosis_harbor.credentials import RolloutCredentials
from osmosis_harbor.errors import OsmosisHarborError, TaskResolutionError, VerifierGuardError
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat import fastpaths as harbor_fastpaths
from osmosis_harbor.harbor_compat.queue_facts import queue_slots
from osmosis_harbor.key_custody import KeyCustody, default_trials_dirs, sweep_unscrubbed
from osmosis_harbor.prewarm.autoscale import AutoscalePolicy
from osmosis_harbor.prewarm.prewarmed import Prewarmed
from osmosis_harbor.prewarm.prewarming import Prewarming
from osmosis_harbor.prewarm.setup_proof import AgentSetup
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner.context import SandboxOwner, add_guard_hooks, owner_scope
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.sandbox.relay.policy_relay import PolicyRelay, RelayRegistration
from osmosis_harbor.sandbox.sdk.registry import implementation
from osmosis_harbor.tasks.carried import add_carried_hooks
from osmosis_harbor.tasks.prepared import PreparedCopies
from osmosis_harbor.tasks.refs import TaskMode
from osmosis_harbor.trials.naming import trial_name as make_trial_name

__all__ = ["InProcessBackend"]


class InProcessBackend:
    """One process's rollouts: admission, status, trials, health, prewarm and shutdown."""

    def __init__(self, options: BackendOptions, *, work_root: Path | None = None) -> None:
        """``work_root``: a worker process's root inside its front's (``backend/workers/``)."""
        harbor_fastpaths.install(options.settings)  # Harbor's per-trial task checks, same answers, less host CPU
        error_policies.install()  # Harbor retries, grades and reports our trial errors as their category says
        self.options = options
        self.agent = options.agent
        self.workspace = Workspace(options.trials_dir, root=work_root)
        self.resolver = task_resolver(options, self.workspace)
        self.environment_config = options.environment_config or default_environment()
        self.max_queue_depth = options.max_queue_depth  # beyond it, POST /rollout answers 429
        # Trials a crashed process could not scrub: the key died with it, so they go.
        given = self.workspace.given_trials_dir()
        sweep_unscrubbed([d for d in (given,) if d is not None] + default_trials_dirs())
        self.custody = KeyCustody()
        self.bundle: BundleInfo | None = prepared_bundle(options)
        if options.is_native:  # validates native_agent_kwargs now (and warns once that oracle is not trainable)
            assert isinstance(options.agent, str)
            native_agent_config(
                options.agent,
                chat_completions_url="http://127.0.0.1/v1",
                model_name=options.model_name,
                native_agent_kwargs=options.native_agent_kwargs,
            )
            preload_model_client()  # a workflow never imports litellm (WorkflowAgent skips the parse)
        self.tracker = RolloutTracker(options.orchestrator)
        self.reservations = Reservations(options.max_queue_depth, self.tracker.queued)
        # What this backend owns (its sandboxes, pools, start bound, rollouts' keys, image builds),
        # found by the environments and agents of its trials (owner_scope), never another's.
        self.sdk_name = SandboxOptions.of(self.environment_config).sdk
        self.owner = SandboxOwner.make(
            "backend", config=options.settings, starts=sandbox_starts(self.sdk_name, options)
        )
        add_guard_hooks(options.orchestrator)  # where each trial's agent phase begins and ends
        add_carried_hooks(options.orchestrator)  # a separate verifier's workdir without the runner's names
        reap_leftovers(self.sdk_name, options.settings)  # what dead owners left on this SDK (the ledger x ls)
        self.prewarmed = Prewarmed(options.settings)
        self.planner = Planner(
            options,
            self.bundle,
            self.environment_config,
            task_pools=self.prewarmed.task_pools,
            prepared=PreparedCopies(self.workspace.prepared_copies_dir),
        )
        self.task_copies = TaskCopies(options, self.planner)
        self.leak_audits = FirstUseAudits(
            prewarmed=self.prewarmed,
            resolver=self.resolver,
            copies=self.task_copies,
            environment_config=self.environment_config,
        )
        self.prewarming = Prewarming(
            AgentSetup(
                self.bundle,
                native_agent=options.agent if options.is_native and isinstance(options.agent, str) else None,
                model_name=options.model_name,
                native_agent_kwargs=options.native_agent_kwargs,
            ),
            resolver=self.resolver,
            environment_config=self.environment_config,
            copies=self.task_copies,
            owner=self.owner,
            prewarmed=self.prewarmed,
            needs_task_ids=options.task_mode is TaskMode.DATASET,
            settings=options.settings,
            autoscale=AutoscalePolicy.from_settings(options.settings),
        )
        self.serving = ServingState(
            options,
            self.environment_config,
            tracker=self.tracker,
            custody=self.custody,
            workspace=self.workspace,
            owner=self.owner,
            prewarming=self.prewarming,
        )
        self.gate = TrialGate(queue_slots(options.orchestrator))  # the queue's slots, retries first: gate.py
        self.runner = TrialRunner(options, self.tracker, self.custody, gate=self.gate)
        # A loopback policy endpoint reaches local sandboxes through this, started on first use.
        self.relay = PolicyRelay(config=options.settings)

    @property
    def starts(self) -> SandboxStarts:
        """The backend's bound on sandbox starts (its owner's)."""
        assert self.owner.starts is not None
        return self.owner.starts

    @property
    def trials_dir(self) -> Path:
        return self.workspace.trials_dir

    # ── the osmosis server's calls ───────────────────────────────────────────
    def has_capacity(self) -> bool:
        """Whether the server may admit one more rollout; a yes holds a queue place for it
        until its execute() starts (``reservations``)."""
        if not (self.serving.accepting and self.serving.ready):  # 429 while prewarm runs
            return False
        return self.reservations.grant() is not None

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        return self.tracker.status(rollout_id)

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        self.reservations.claim()  # the place has_capacity() held for this rollout
        if not self.serving.accepting:
            return refused(
                "the backend is shutting down", {"failed_phase": "task"}, RolloutErrorCategory.INTERNAL_ERROR
            )
        ctx = get_rollout_context()
        listener = ctx.set_status if ctx is not None and ctx.progress is not None else None
        self.tracker.admit(request.id, listener)
        started = time.monotonic()
        try:
            # What the rollout's trial makes is this backend's (its environment and agent find it).
            with owner_scope(self.owner):
                outcome = await self._execute(request, ctx)
        except asyncio.CancelledError:
            self.tracker.finish(request.id, RolloutStatus.CANCELLED, error="cancelled")
            raise
        except VerifierGuardError as exc:  # the deployment cannot guard a verifier (no compiler, say)
            outcome = refused(str(exc), {"failed_phase": "task"}, RolloutErrorCategory.INTERNAL_ERROR)
        except OsmosisHarborError as exc:  # bad input found while preparing (e.g. an empty prompt)
            outcome = refused(str(exc), {"failed_phase": "task"})
        except Exception as exc:  # a bug: the server reports it; the status must not stay "queued"
            self.tracker.finish(
                request.id,
                RolloutStatus.FAILURE,
                error=f"{type(exc).__name__}: {exc}",
                err_category=RolloutErrorCategory.INTERNAL_ERROR,
            )
            raise
        self.tracker.finish_with(request.id, outcome)
        for part in (outcome.workflow, outcome.grader):
            if part is not None and part.extra_fields is not None:
                part.extra_fields.setdefault("wall_sec", round(time.monotonic() - started, 3))
        return outcome

    def cancel_rollouts(
        self, ids: Sequence[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        """Cancel matching rollouts: a queued one never starts a sandbox, a running one is
        stopped and its sandbox terminated (Harbor's trial does that on cancellation)."""
        dispositions: dict[str, str] = {}
        for rollout_id in self.tracker.select(ids, prefix, all):
            state = self.tracker.get(rollout_id)
            if state is None or state.status in TERMINAL:
                dispositions[rollout_id] = "not_found"
                continue
            queued = state.status is RolloutStatus.QUEUED
            state.cancel_requested = True
            if state.task is not None and not state.task.done():
                state.task.cancel()
            dispositions[rollout_id] = "cancelled_queued" if queued else "cancelled_running"
        return dispositions

    def health(self) -> dict[str, Any]:
        return {
            **self.serving.health(
                max_queue_depth=self.max_queue_depth,
                max_concurrent=self.gate.capacity,
                queued=self.reservations.queued(),
            ),
            **self.starts.state(),
            "waiting_for_slot": self.gate.waiting,  # admitted, waiting for one of the queue's slots
        }

    async def shutdown(self) -> None:
        await self.serving.shutdown()
        await self.relay.aclose()
        # After its sandboxes and pools are gone: a local SDK server this process started
        # (the emulator's on-demand one) stops with it; one that was already running stays.
        await asyncio.to_thread(implementation(self.sdk_name).stop_local_servers)

    # ── one rollout ───────────────────────────────────────────────────────────
    async def _execute(self, request: ExecutionRequest, ctx: RolloutContext | None) -> ExecutionOutcome:
        if ctx is not None and ctx.progress is not None:
            # The server marks a started rollout "running"; here it still waits for a slot.
            await ctx.set_status(RolloutStatus.QUEUED)
        url = ctx.chat_completions_url if ctx is not None else ""
        key = ctx.api_key if ctx is not None else None
        problem = request_problem(request) or endpoint_problem(self.options, self.environment_config, url)
        if problem:
            return refused(problem, {"failed_phase": "task"})
        try:
            resolved = await self.resolver.resolve(request.metadata)
        except TaskResolutionError as exc:
            return refused(str(exc), {"failed_phase": "task"})
        plan = await asyncio.to_thread(self.planner.plan, resolved, request)
        if isinstance(plan, Refusal):
            return refused(plan.message, plan.extra)
        failed = self.prewarmed.failed_tasks.get(resolved.task_id)
        if failed is not None:
            return refused(
                f"task {resolved.task_id} failed prewarm: {failed}",
                {"failed_phase": "environment", "task_id": resolved.task_id},
            )
        leaking = await self.leak_audits.refusal(resolved)  # prewarm's audit, else one on first use
        if leaking is not None:
            return refused(leaking, {"failed_phase": "task", "task_id": resolved.task_id})
        return await self._run(request, plan, url, key)

    async def _run(self, request: ExecutionRequest, plan: RolloutPlan, url: str, key: str | None) -> ExecutionOutcome:
        # Paths derive from the bounded, unique trial name, never from the raw rollout id.
        name = make_trial_name(request.id, max_slug=24, fallback="rollout")
        work = self.workspace.rollout_dir(name)
        try:
            relayed = await self._relay(url)
        except OsmosisHarborError as exc:  # the engine or its network: the host's failure
            return refused(str(exc), {"failed_phase": "environment"}, RolloutErrorCategory.INTERNAL_ERROR)
        sandbox_url = relayed.sandbox_url if relayed is not None else None
        self.owner.credentials.hold(request.id, RolloutCredentials(url, key, sandbox_url))
        key_scope = scoped_api_key(key) if self.options.is_native else contextlib.nullcontext("")
        try:
            with key_scope as key_env:
                # File work (the task copy) runs off the event loop: thousands may queue at once.
                config = await asyncio.to_thread(
                    self.planner.trial_config,
                    plan,
                    request,
                    work=work,
                    trial_name=name,
                    trials_dir=self.trials_dir,
                    url=sandbox_url or url,  # a native agent whose client runs in the sandbox
                    key_env=key_env,
                )
                attempt = Attempt(
                    request=request,
                    plan=plan,
                    config=config,
                    key=key,
                    native_agent=self.agent if isinstance(self.agent, str) and self.options.is_native else None,
                    relay=relayed.record if relayed is not None else None,
                )
                return await self.runner.run(attempt)
        finally:
            self.owner.credentials.drop(request.id)
            if relayed is not None:
                relayed.close()
            await asyncio.to_thread(shutil.rmtree, work, True)

    async def _relay(self, url: str) -> RelayRegistration | None:
        """The rollout's way to a loopback endpoint through the policy relay, when it needs one."""
        if not relays_endpoint(self.options, self.environment_config, url):
            return None
        return await self.relay.register(url)
