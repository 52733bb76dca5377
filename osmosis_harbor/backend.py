"""``HarborBackend``: the ``osmosis_ai`` execution backend that runs each rollout as a
Harbor trial in a SkyPilot sandbox (or a local Docker sandbox).

Per rollout: resolve the task (template or dataset mode, or a per-rollout ref), copy it
with the request's instruction and grading input, submit one trial through the user's
``TrialQueue`` (agent = the workflow bundle, verifier = the bundled grader or the task's
own tests), then read the trial directory back into an ``ExecutionOutcome``. The
constructor does all the checking it can (bundle built, tasks dir valid) so that a
misconfigured server fails at start-up, not on its first rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from harbor.models.trial.config import (
    AgentConfig,
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.context import get_rollout_context
from osmosis_ai.rollout.types import (
    ExecutionOutcome,
    ExecutionRequest,
    RolloutErrorCategory,
    RolloutStatus,
)

from . import credentials
from .native import NATIVE_AGENTS, native_agent_config, sample_from_trajectory, scoped_api_key
from .bundle import BundleInfo, build_bundle, inspect_bundle
from .harness import IMPORT_PATH as HARNESS_IMPORT_PATH
from .backend_lifecycle import BackendLifecycle
from .backend_support import (
    LEGACY_KWARGS,
    cancelled_outcome,
    legacy_error,
    locate_project,
    preload_model_client,
    refused,
    request_problem,
)
from .naming import trial_name as make_trial_name
from .harness import VENV
from .prewarm import PrewarmReport
from .secrets import KeyCustody, default_trials_dirs, sweep_unscrubbed
from .queue import TERMINAL, RolloutTracker
from .tasks import (
    EnvironmentPatch,
    ResolvedTask,
    TaskMode,
    TaskResolutionError,
    TaskResolver,
    materialize_task,
    render_prompt,
    task_step_names,
)
from .trial_outcome import RewardSource, build_outcome, lost_sandbox_message

DEFAULT_MODEL_NAME = "openai/osmosis-rollout"
# Native agents whose model client runs inside the sandbox (and so must reach the endpoint
# from there); terminus-2 calls the model from the host process.
_IN_SANDBOX_CLIENTS = {"mini-swe-agent"}
GRADE_SCRIPT = "osmosis_grade.sh"
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def _checked_grader_inputs(paths: Sequence[str]) -> tuple[str, ...]:
    """Absolute sandbox paths the grader reads besides the agent's workdir (see ``isolate_verifier``)."""
    if isinstance(paths, str):
        raise TypeError(f"grader_inputs must be a list of sandbox paths, not the string {paths!r}")
    checked = []
    for path in paths:
        posix = PurePosixPath(str(path))
        if not posix.is_absolute() or ".." in posix.parts or posix == PurePosixPath("/"):
            raise ValueError(f"grader_inputs: {path!r} must be an absolute sandbox path below / without '..'")
        checked.append(str(posix))
    return tuple(checked)


class HarborBackend(BackendLifecycle, ExecutionBackend):
    """Runs Osmosis rollouts as Harbor trials in sandboxes (the v0.3 constructor)."""

    def __init__(
        self,
        *,
        orchestrator: TrialQueue,
        tasks_dir: Path,
        task_mode: TaskMode | str = TaskMode.TEMPLATE,
        agent: str | type | None = None,
        workflow_config: Any = None,
        grader: str | type | None = None,
        grader_config: Any = None,
        code_dir: Path | None = None,
        bundle: Path | None = None,
        native_agent_kwargs: dict[str, Any] | None = None,
        model_name: str = DEFAULT_MODEL_NAME,
        patch_dockerfile_with_sdk: bool = True,
        agent_setup_timeout_sec: float | None = None,
        max_queue_depth: int | None = None,
        environment_config: EnvironmentConfig | None = None,
        trials_dir: Path | None = None,
        cleanup_successful_trials: bool = True,
        bundles_dir: Path | None = None,
        grader_inputs: Sequence[str] = (),
        infra_retries: int = 0,
        **legacy: Any,
    ) -> None:
        if legacy:
            known = [k for k in legacy if k in LEGACY_KWARGS]
            if known:
                raise legacy_error(known)
            raise TypeError(f"HarborBackend got unexpected keyword argument(s): {', '.join(legacy)}")
        if not isinstance(orchestrator, TrialQueue):
            raise TypeError(f"orchestrator must be a harbor TrialQueue, not {type(orchestrator).__name__}")
        if max_queue_depth is not None and max_queue_depth < 1:
            raise ValueError(f"max_queue_depth must be None (unbounded) or >= 1, got {max_queue_depth}")
        if isinstance(infra_retries, bool) or not isinstance(infra_retries, int) or infra_retries < 0:
            raise ValueError(f"infra_retries must be an integer >= 0, got {infra_retries!r}")
        if agent is None:
            raise TypeError("agent= is required: an AgentWorkflow class or import path, or one of "
                            + ", ".join(NATIVE_AGENTS))
        self.grader_inputs = _checked_grader_inputs(grader_inputs)
        self.orchestrator = orchestrator
        self.task_mode = TaskMode(task_mode)
        self.tasks_dir = Path(tasks_dir)
        self.resolver = TaskResolver(self.tasks_dir, self.task_mode)
        self.agent = agent
        self.model_name = model_name
        self.native_agent_kwargs = dict(native_agent_kwargs or {})
        self.patch_dockerfile_with_sdk = patch_dockerfile_with_sdk
        self.agent_setup_timeout_sec = agent_setup_timeout_sec
        self.max_queue_depth = max_queue_depth
        # Default 0: a retry runs the workflow again under the same rollout id, so the policy
        # endpoint sees the chat calls of both attempts; opt in where the trainer tolerates that.
        self.infra_retries = infra_retries
        self.cleanup_successful_trials = cleanup_successful_trials
        if environment_config is None:
            from .sandbox import environment_config as make_environment_config

            environment_config = make_environment_config("skypilot")
        self.environment_config = environment_config
        # The temporary work root is made on first use (the first rollout), so a backend that
        # only prewarms, or fails to construct, leaves no directory behind.
        self._work_root_path: Path | None = None
        self._work_root_lock = threading.Lock()
        self._trials_dir = Path(trials_dir) if trials_dir is not None else None
        if self._trials_dir is not None:
            self._trials_dir.mkdir(parents=True, exist_ok=True)
        # Trials a crashed process could not scrub: the key died with it, so they go.
        sweep_unscrubbed([d for d in (self._trials_dir,) if d is not None] + default_trials_dirs())
        self.custody = KeyCustody()
        self.is_native = isinstance(agent, str) and agent in NATIVE_AGENTS
        self.grader = grader
        self.bundle: BundleInfo | None = self._prepare_bundle(
            agent=None if self.is_native else agent,
            workflow_config=workflow_config, grader=grader, grader_config=grader_config,
            code_dir=code_dir, bundle=bundle, bundles_dir=bundles_dir,
        )
        if self.is_native:
            # Validates native_agent_kwargs now (and warns once that oracle is not trainable).
            native_agent_config(agent, chat_completions_url="http://127.0.0.1/v1", model_name=model_name,
                                native_agent_kwargs=self.native_agent_kwargs)
        elif isinstance(agent, str) and ":" not in agent and "." not in agent:
            raise ValueError(f"unknown agent {agent!r}: pass an AgentWorkflow class or 'module:Class' "
                             f"import path, or one of the native agents {', '.join(NATIVE_AGENTS)}")
        preload_model_client()
        self.tracker = RolloutTracker(orchestrator)
        self._accepting = True
        self.failed_prewarm_tasks: dict[str, str] = {}
        self.prewarm_report: PrewarmReport | None = None
        self._task_pools: dict[str, str] = {}

    # ── construction helpers ─────────────────────────────────────────────────
    @staticmethod
    def _prepare_bundle(*, agent, workflow_config, grader, grader_config, code_dir, bundle,
                        bundles_dir) -> BundleInfo | None:
        if bundle is not None:
            info = inspect_bundle(Path(bundle))
            if agent is not None and info.agent_script is None:
                raise ValueError(f"bundle {bundle} has no workflow entry point (<pkg>-agent)")
            if grader is not None and info.grade_script is None:
                raise ValueError(f"bundle {bundle} has no grader entry point (<pkg>-grade)")
            return info
        if agent is None and grader is None:
            return None
        if code_dir is None:
            code_dir = locate_project(agent if agent is not None else grader)
        return build_bundle(
            Path(code_dir), workflow=agent, workflow_config=workflow_config,
            grader=grader, grader_config=grader_config, cache_dir=bundles_dir,
        )

    @property
    def _work_root(self) -> Path:
        """Per-rollout task copies (and the trials, unless ``trials_dir`` was given)."""
        with self._work_root_lock:
            if self._work_root_path is None:
                self._work_root_path = Path(tempfile.mkdtemp(prefix="osmosis-harbor-"))
            return self._work_root_path

    @property
    def trials_dir(self) -> Path:
        if self._trials_dir is None:
            trials = self._work_root / "trials"
            trials.mkdir(exist_ok=True)
            self._trials_dir = trials
        return self._trials_dir

    @property
    def _uses_host_network(self) -> bool:
        return bool(self.environment_config.kwargs.get("host_network"))

    # ── ExecutionBackend ──────────────────────────────────────────────────────
    def has_capacity(self) -> bool:
        """Whether the server may admit one more rollout (it asks once per admission).

        A yes reserves a queue place until that rollout's execute() starts, so a burst of
        concurrent POSTs cannot overshoot ``max_queue_depth``."""
        if not self._accepting:
            return False
        if self.max_queue_depth is not None and self.tracker.queued() >= self.max_queue_depth:
            return False
        self.tracker.reserve()
        return True

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        return self.tracker.status(rollout_id)

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        if not self._accepting:
            return refused("the backend is shutting down", {"failed_phase": "task"},
                            RolloutErrorCategory.INTERNAL_ERROR)
        ctx = get_rollout_context()
        listener = ctx.set_status if ctx is not None and ctx.progress is not None else None
        self.tracker.admit(request.id, listener)
        started = time.monotonic()
        try:
            outcome = await self._execute(request, ctx)
        except asyncio.CancelledError:
            self.tracker.finish(request.id, RolloutStatus.CANCELLED, error="cancelled")
            raise
        except ValueError as exc:  # bad input found while preparing (e.g. an empty prompt)
            outcome = refused(str(exc), {"failed_phase": "task"})
        except Exception as exc:  # the server reports it; the status must not stay "queued"
            self.tracker.finish(request.id, RolloutStatus.FAILURE, error=f"{type(exc).__name__}: {exc}",
                                err_category=RolloutErrorCategory.INTERNAL_ERROR)
            raise
        result = outcome.result
        self.tracker.finish(
            request.id, result.status,
            reward=result.sample.reward if result.sample is not None else None,
            error=result.err_message, err_category=result.err_category,
        )
        for part in (outcome.workflow, outcome.grader):
            if part is not None and part.extra_fields is not None:
                part.extra_fields.setdefault("wall_sec", round(time.monotonic() - started, 3))
        return outcome

    def cancel_rollouts(self, ids: Sequence[str] | None = None, prefix: str | None = None,
                        all: bool = False) -> dict[str, str]:
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

    async def _execute(self, request: ExecutionRequest, ctx) -> ExecutionOutcome:
        if ctx is not None and ctx.progress is not None:
            # The server marks a started rollout "running"; here it still waits for a slot.
            await ctx.set_status(RolloutStatus.QUEUED)
        url = ctx.chat_completions_url if ctx is not None else ""
        key = ctx.api_key if ctx is not None else None
        problem = request_problem(request) or self._endpoint_problem(url)
        if problem:
            return refused(problem, {"failed_phase": "task"})
        try:
            resolved = await self.resolver.resolve(request.metadata)
        except TaskResolutionError as exc:
            return refused(str(exc), {"failed_phase": "task"})
        steps = await asyncio.to_thread(task_step_names, resolved.path)
        if steps and self.task_mode is TaskMode.TEMPLATE and not self.is_native:
            return refused(
                f"task {resolved.task_id} is a multi-step task (steps {', '.join(steps)}): template mode "
                "replaces instruction.md with the prompt, which a multi-step task does not have; serve it "
                "in dataset mode, where each step's instruction reaches the workflow as the next turn",
                {"failed_phase": "task", "task_id": resolved.task_id})
        reward_source = self._reward_source(request, resolved, steps)
        if isinstance(reward_source, ExecutionOutcome):
            return reward_source

        if resolved.task_id in self.failed_prewarm_tasks:
            return refused(f"task {resolved.task_id} failed prewarm: {self.failed_prewarm_tasks[resolved.task_id]}",
                            {"failed_phase": "environment", "task_id": resolved.task_id})
        # Paths derive from the bounded, unique trial name, never from the raw rollout id.
        trial_name = make_trial_name(request.id, max_slug=24, fallback="rollout")
        work = self._work_root / "rollouts" / trial_name
        trial_dir = self.trials_dir / trial_name
        credentials.put(request.id, credentials.RolloutCredentials(url, key))
        base_extra = {"task_id": resolved.task_id, "trial_name": trial_name}
        key_scope = scoped_api_key(key) if self.is_native else contextlib.nullcontext("")
        try:
            with key_scope as key_env:
                return await self._run_trial(request, resolved, reward_source, work, trial_name,
                                             trial_dir, key, key_env, base_extra, url)
        finally:
            credentials.drop(request.id)
            await asyncio.to_thread(shutil.rmtree, work, True)

    async def _run_trial(self, request: ExecutionRequest, resolved: ResolvedTask, reward_source: str,
                         work: Path, trial_name: str, trial_dir: Path, key: str | None, key_env: str,
                         base_extra: dict[str, Any], url: str) -> ExecutionOutcome:
        succeeded = False
        try:
            # File work (the task copy) runs off the event loop: thousands may queue at once.
            config = await asyncio.to_thread(
                self._trial_config, request, resolved, reward_source, work, trial_name, url, key_env)
            # From here until sealed, the trial directory may receive the key (see secrets.py).
            await asyncio.to_thread(self.custody.hold, trial_dir, key)
            self.tracker.bind_trial(request.id, trial_name, resolved.task_id)
            state = self.tracker.get(request.id)
            if state is not None and state.cancel_requested:
                return cancelled_outcome(base_extra)
            result, trial_dir, base_extra = await self._attempts(
                request, resolved.task_id, config, state, trial_dir, base_extra, key)
            if isinstance(result, ExecutionOutcome):
                return result
            await asyncio.to_thread(self.custody.seal, trial_dir)  # before anything reads the trial
            outcome = self._outcome(result, trial_dir, reward_source, request, base_extra)
            succeeded = outcome.result.status is RolloutStatus.SUCCESS
            return outcome
        finally:  # every other ending too: cancelled, refused, our own task cancelled
            await asyncio.to_thread(self._close_trial, trial_dir, succeeded and self.cleanup_successful_trials)

    def _close_trial(self, trial_dir: Path, remove: bool) -> None:
        self.custody.seal(trial_dir)  # a no-op when already sealed
        if remove:
            shutil.rmtree(trial_dir, True)

    async def _attempts(self, request: ExecutionRequest, task_id: str, config: TrialConfig, state,
                        trial_dir: Path, base_extra: dict[str, Any], key: str | None):
        """Run the trial, and again on a fresh sandbox after each sandbox lost to the
        infrastructure, at most ``infra_retries`` times (never after a workflow failure).
        Returns the last result (or the outcome that ended the rollout), its trial directory,
        and the extra fields recording the attempts."""
        lost: list[dict[str, str]] = []
        while True:
            result = await self._submit(config, state, base_extra)
            reason = None if isinstance(result, ExecutionOutcome) else lost_sandbox_message(result)
            if reason is None or len(lost) >= self.infra_retries:
                break
            lost.append({"trial_name": config.trial_name, "error": reason})
            if state is not None and state.cancel_requested:  # cancelled between attempts
                await asyncio.to_thread(shutil.rmtree, trial_dir, True)
                return cancelled_outcome({**base_extra, "lost_sandboxes": lost}), trial_dir, base_extra
            config, trial_dir = await self._fresh_attempt(request, task_id, config, trial_dir, key)
            base_extra = {**base_extra, "trial_name": config.trial_name}
        base_extra = {**base_extra, "attempts": len(lost) + 1}
        if lost:
            base_extra["lost_sandboxes"] = lost
        return result, trial_dir, base_extra

    async def _submit(self, config: TrialConfig, state, base_extra: dict[str, Any]):
        """One trial through the user's queue: its result, or the outcome that ends the rollout
        (cancelled, or a trial Harbor could not create)."""
        trial = asyncio.ensure_future(self.orchestrator.submit(config))
        if state is not None:
            state.task = trial
        try:
            return await asyncio.shield(trial)
        except asyncio.CancelledError:
            if not trial.done():  # our own task was cancelled: take the trial down with us
                trial.cancel()
                await asyncio.gather(trial, return_exceptions=True)
                raise
            if asyncio.current_task().cancelling():
                raise
            return cancelled_outcome(base_extra)  # cancel_rollouts cancelled the trial
        except Exception as exc:  # Trial.create errors escape the queue's coroutine
            return refused(f"trial could not be created: {type(exc).__name__}: {exc}",
                           {**base_extra, "failed_phase": "environment"}, RolloutErrorCategory.INTERNAL_ERROR)

    async def _fresh_attempt(self, request: ExecutionRequest, task_id: str, config: TrialConfig,
                             trial_dir: Path, key: str | None) -> tuple[TrialConfig, Path]:
        """The next attempt after a lost sandbox: a new trial name, so a new sandbox name (the
        lost one is never reused; Harbor's stop already terminated what was left of it). The
        lost attempt's trial directory goes: only the outcome's ``lost_sandboxes`` remain."""
        await asyncio.to_thread(self._close_trial, trial_dir, True)
        name = make_trial_name(request.id, max_slug=24, fallback="rollout")
        await asyncio.to_thread(self.custody.hold, self.trials_dir / name, key)  # the new one's custody
        self.tracker.bind_trial(request.id, name, task_id)
        return config.model_copy(update={"trial_name": name}), self.trials_dir / name

    def _outcome(self, result, trial_dir: Path, reward_source: str, request: ExecutionRequest,
                 base_extra: dict[str, Any]) -> ExecutionOutcome:
        agent_sample = ...
        if self.is_native:
            try:
                agent_sample = sample_from_trajectory(trial_dir)
            except ValueError as exc:  # a trajectory we cannot read: keep the reward, say why
                base_extra = {**base_extra, "trajectory_error": str(exc)}
                agent_sample = None
            if agent_sample is None:
                from osmosis_ai.rollout.types import RolloutSample

                agent_sample = RolloutSample(messages=list(request.prompt))
            base_extra = {**base_extra, "native_agent": self.agent}
        return build_outcome(result, trial_dir, reward_source=reward_source, label=request.label,
                             base_extra=base_extra, agent_sample=agent_sample)

    # ── per-rollout pieces ────────────────────────────────────────────────────
    def _endpoint_problem(self, url: str) -> str | None:
        if self.is_native and self.agent == "oracle":
            return None
        if not url:
            return "the rollout has no chat-completions URL (no active RolloutContext)"
        host = urlparse(url).hostname or ""
        in_sandbox = not self.is_native or self.agent in _IN_SANDBOX_CLIENTS
        if in_sandbox and (host in _LOOPBACK_HOSTS or host.startswith("127.")):
            if not self._uses_host_network:
                return (
                    f"the chat-completions endpoint {url} is on this machine's loopback, which the "
                    "sandbox cannot reach; serve it on a routable address, or for local Docker "
                    "sandboxes use environment_config('docker', host_network=True)"
                )
        return None

    def _reward_source(self, request: ExecutionRequest, task: ResolvedTask,
                       steps: Sequence[str] = ()) -> str | ExecutionOutcome:
        if not request.grade:
            return RewardSource.NONE
        if steps or (task.path / "tests" / "test.sh").is_file():  # a task's own tests always win
            return RewardSource.TASK_TESTS
        if self.grader is not None:
            return RewardSource.GRADER
        return refused(
            f"task {task.task_id} has no tests/test.sh and no grader= was given: pass an Osmosis "
            "grader or add tests to the task (or send grade=false)", {"failed_phase": "task"})

    def _grades_with_grader(self, task: ResolvedTask, request: ExecutionRequest | None) -> bool:
        """Whether the bundled grader is this rollout's verifier. Prewarm (no request) asks
        about the rollouts to come: graded ones, so that it builds and proves what they run."""
        steps = task_step_names(task.path)
        if request is not None:
            return self._reward_source(request, task, steps) == RewardSource.GRADER
        return self.grader is not None and not steps and not (task.path / "tests" / "test.sh").is_file()

    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> Path:
        """The per-rollout task copy. Prewarm calls it with ``request=None`` and gets the same
        copy a graded rollout runs (generated ``tests/test.sh`` included, without the
        request's grading input): its image hash and its setup proof are the rollout's.

        With the grader as verifier, the grader wheel and its installer travel in
        ``tests/`` and the verifier runs in a fresh sandbox (``isolate_verifier``): nothing
        the workflow did to its own sandbox can reach the reward."""
        grading_input = None
        grade_command = None
        grader = self._grades_with_grader(task, request)
        if grader:
            assert self.bundle is not None and self.bundle.grade_script
            if request is not None:
                grading_input = {"rollout_id": request.id, "label": request.label,
                                 "metadata": request.metadata, "prompt": request.prompt}
            grade_command = f"/bin/sh /tests/{GRADE_SCRIPT}"
        patch = None
        if self.bundle is not None and self.patch_dockerfile_with_sdk:
            patch = EnvironmentPatch(requirements=list(self.bundle.dependencies))
        instruction = None
        if request is not None and self.task_mode is TaskMode.TEMPLATE:
            instruction = render_prompt(request.prompt)
        dest.parent.mkdir(parents=True, exist_ok=True)
        materialized = materialize_task(task, dest, instruction=instruction, grading_input=grading_input,
                                        grade_command=grade_command, environment_patch=patch,
                                        isolate_grader=True, grader_inputs=self.grader_inputs)
        if materialized.generated_tests:
            self._stage_grader_install(Path(materialized) / "tests", materialized.environment_patched)
        return materialized

    def _stage_grader_install(self, tests_dir: Path, deps_baked: bool) -> None:
        """Put the grader wheel and its installer next to the generated test.sh: Harbor uploads
        tests/ only at verification, so the agent phase never sees either."""
        from .harness import install_command

        assert self.bundle is not None and self.bundle.grade_script
        shutil.copy2(self.bundle.wheel, tests_dir / self.bundle.wheel.name)
        script = tests_dir / GRADE_SCRIPT
        script.write_text(
            "#!/bin/sh\n"
            f"{install_command(PurePosixPath('/tests') / self.bundle.wheel.name, deps_preinstalled=deps_baked)}\n"
            f"exec {VENV / 'bin' / self.bundle.grade_script}\n"
        )
        script.chmod(0o755)

    def metadata_for_task(self, task_id: str) -> dict[str, Any] | None:
        """Request metadata that selects ``task_id`` (prewarm resolves tasks like rollouts)."""
        return None if self.task_mode is TaskMode.TEMPLATE else {"harbor_task_id": task_id}

    def _trial_config(self, request: ExecutionRequest, task: ResolvedTask, reward_source: str,
                      work: Path, trial_name: str, url: str, key_env: str) -> TrialConfig:
        materialized = self.materialize(task, work / "task", request=request)
        deps_baked = bool(getattr(materialized, "environment_patched", False))
        environment = self.environment_config
        kwargs = {k: v for k, v in environment.kwargs.items() if k not in {"pool", "pool_size"}}
        if task.task_id in self._task_pools:  # prewarm made this task's group pool: claim from it
            kwargs["pool"] = self.environment_config.kwargs.get("pool")
        environment = environment.model_copy(update={"kwargs": kwargs})
        return TrialConfig(
            task=TaskConfig(path=Path(materialized)),
            trial_name=trial_name,
            trials_dir=self.trials_dir,
            agent=(self._native_config(request, url, key_env) if self.is_native
                   else self._agent_config(request, work, materialized)),
            environment=environment,
            verifier=VerifierConfig(
                disable=reward_source == RewardSource.NONE,
                override_timeout_sec=request.grader_timeout_sec,
            ),
        )

    def _native_config(self, request: ExecutionRequest, url: str, key_env: str) -> AgentConfig:
        model = (request.metadata or {}).get("harbor_model") or self.model_name
        return native_agent_config(
            self.agent, chat_completions_url=url or None, api_key_env=key_env or "OSMOSIS_API_KEY",
            model_name=model, native_agent_kwargs=self.native_agent_kwargs,
            agent_timeout_sec=request.agent_timeout_sec, agent_setup_timeout_sec=self.agent_setup_timeout_sec,
        )

    def _agent_config(self, request: ExecutionRequest, work: Path, materialized: Path) -> AgentConfig:
        assert self.bundle is not None and self.bundle.agent_script
        deps_baked = bool(getattr(materialized, "environment_patched", False))
        rollout_input = work / "rollout_input.json"
        rollout_input.write_text(json.dumps(
            {"rollout_id": request.id, "prompt": request.prompt, "metadata": request.metadata}))
        return AgentConfig(
            import_path=HARNESS_IMPORT_PATH,
            model_name=self.model_name,
            override_timeout_sec=request.agent_timeout_sec,
            override_setup_timeout_sec=self.agent_setup_timeout_sec,
            kwargs={
                "bundle_wheel": str(self.bundle.wheel),
                "agent_script": self.bundle.agent_script,
                "rollout_id": request.id,
                "rollout_input": str(rollout_input),
                "deps_preinstalled": deps_baked,
                "steps": task_step_names(Path(materialized)) or None,
            },
        )
