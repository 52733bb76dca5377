"""The rollout plan: one request turned into one Harbor ``TrialConfig``, every decision made once.

``Planner.plan`` decides, for a resolved task and a request, what the trial is: its steps, where
its reward comes from (``RewardSource``), whether the bundled grader is its verifier (then in a
sandbox of its own), where a task's own tests run (``tasks/verification.py``: a fresh sandbox of
the task's image, or the agent's under the guard), and whether it claims from a prewarmed pool. The decisions travel as a
frozen ``RolloutPlan``; ``Planner.trial_config`` materializes the task copy from it (the copy
says, as data, whether the bundle and its dependencies are baked into the image) and builds the
``TrialConfig``. Prewarm asks the same planner for the plan of a graded rollout to come, so
its image hash and setup proof are the rollout's.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.models.trial.config import (
    AgentConfig,
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)
from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor.agents.native import native_agent_config
from osmosis_harbor.agents.workflow import IMPORT_PATH as WORKFLOW_AGENT
from osmosis_harbor.agents.workflow import VENV, agent_timeout_budget, bundle_check_command, install_command
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.bundle.info import BundleInfo
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.guard import GuardPlan, guard_binary
from osmosis_harbor.sandbox.options import IMPORT_PATH, SandboxOptions
from osmosis_harbor.shim.models import GradingInput, RolloutInput
from osmosis_harbor.tasks.dockerfile import EnvironmentPatch
from osmosis_harbor.tasks.materialize import MaterializedTask, prepare_task, stage_rollout
from osmosis_harbor.tasks.prepared import PreparedCopies
from osmosis_harbor.tasks.prompt import render_prompt
from osmosis_harbor.tasks.refs import ResolvedTask, TaskMode
from osmosis_harbor.tasks.verification import Verification, VerificationMode, decide_verification
from osmosis_harbor.tasks.verifier import task_step_names
from osmosis_harbor.tasks.verifier_allowance import guard_plan
from osmosis_harbor.tasks.verifier_shell import shell_exec_refusal
from osmosis_harbor.trials.contract_files import ContractBounds

__all__ = ["GRADE_SCRIPT", "Planner", "Refusal", "RewardSource", "RolloutPlan"]

GRADE_SCRIPT = "osmosis_grade.sh"


class RewardSource(StrEnum):
    """Where a rollout's reward comes from: the plan decides it once, the outcome reads it."""

    GRADER = "grader"
    TASK_TESTS = "task_tests"
    NONE = "none"


@dataclass(frozen=True)
class RolloutPlan:
    """What one rollout's trial is, decided before anything is copied or started."""

    task: ResolvedTask
    steps: tuple[str, ...]
    reward_source: RewardSource
    claims_pool: bool  # prewarm made this task's group pool: the trial claims from it
    guard: GuardPlan | None = None  # the task's tests run in the agent's sandbox, under the guard
    verification: Verification | None = None  # where the task's own tests run (TASK_TESTS only)

    @property
    def grader_verifies(self) -> bool:
        """The bundled grader is the verifier (in a sandbox of its own, ``isolate_verifier``)."""
        return self.reward_source is RewardSource.GRADER

    @property
    def fresh_verifier(self) -> tuple[str, ...] | None:
        """The paths carried into a fresh verifier's sandbox, or None: not a fresh verification."""
        fresh = self.verification is not None and self.verification.mode is VerificationMode.FRESH
        return self.verification.carried if fresh and self.verification is not None else None

    @property
    def verifier_sandbox(self) -> bool:
        """The verifier runs in a sandbox of its own that the host creates (the grader's, or a
        fresh one for the task's tests): what a head start can make early."""
        return self.grader_verifies or self.fresh_verifier is not None


@dataclass(frozen=True)
class Refusal:
    """Why a request cannot run on its task, found before anything is copied."""

    message: str
    extra: dict[str, Any]


class Planner:
    """Turns requests into plans and plans into ``TrialConfig``s, for one backend's options."""

    def __init__(
        self,
        options: BackendOptions,
        bundle: BundleInfo | None,
        environment: EnvironmentConfig,
        task_pools: Mapping[str, str],
        prepared: PreparedCopies | None = None,
    ) -> None:
        self.options = options
        self.bundle = bundle
        self.environment = environment
        self._task_pools = task_pools  # task id -> the warm pool prewarm made for it (filled later)
        self._prepared = prepared  # None: every copy is made from the task afresh
        # What a workflow agent reads its trial's files within (plain data: Harbor's agent kwargs).
        self._contract_bounds = ContractBounds.of(options.settings).model_dump()

    # ── decisions ────────────────────────────────────────────────────────────
    def plan(self, task: ResolvedTask, request: ExecutionRequest | None) -> RolloutPlan | Refusal:
        """The plan of ``request`` on ``task``, or why it cannot run. Without a request: the plan
        of a graded rollout to come (what prewarm builds and proves)."""
        steps = tuple(task_step_names(task.path))
        if steps and request is not None and self.options.task_mode is TaskMode.TEMPLATE and not self.options.is_native:
            return Refusal(
                f"task {task.task_id} is a multi-step task (steps {', '.join(steps)}): template mode "
                "replaces instruction.md with the prompt, which a multi-step task does not have; serve it "
                "in dataset mode, where each step's instruction reaches the workflow as the next turn",
                {"failed_phase": "task", "task_id": task.task_id},
            )
        source = self._reward_source(task, steps, graded=request is None or request.grade)
        if source is None and request is None:  # prewarm of an ungraded task: nothing to stage
            source = RewardSource.NONE
        if source is None:
            return Refusal(
                f"task {task.task_id} has no tests/test.sh and no grader= was given: pass an Osmosis "
                "grader or add tests to the task (or send grade=false)",
                {"failed_phase": "task"},
            )
        guard = verification = None
        if source is RewardSource.TASK_TESTS:
            verification = decide_verification(task.path, config=self.options.settings)
            if verification.mode is VerificationMode.SHARED:  # fresh and separate: no agent sandbox to guard
                guard = guard_plan(task.path, native_agent=self.options.is_native, config=self.options.settings)
        ours = self.environment.import_path == IMPORT_PATH  # the guard runs in our environment only
        sdk = SandboxOptions.of(self.environment).impl
        guarded = ours and guard is not None
        refusal = request and shell_exec_refusal(
            task.path, task.task_id, sdk, guarded=guarded, config=self.options.settings
        )
        if refusal:  # a rollout the guard cannot protect (prewarm, request None, still builds its image)
            return Refusal(refusal, {"failed_phase": "task", "task_id": task.task_id})
        return RolloutPlan(
            task=task,
            steps=steps,
            reward_source=source,
            claims_pool=task.task_id in self._task_pools,
            guard=guard,
            verification=verification,
        )

    def _reward_source(self, task: ResolvedTask, steps: tuple[str, ...], *, graded: bool) -> RewardSource | None:
        if not graded:
            return RewardSource.NONE
        if steps or (task.path / "tests" / "test.sh").is_file():  # a task's own tests always win
            return RewardSource.TASK_TESTS
        if self.options.grader is not None:
            return RewardSource.GRADER
        return None

    # ── the task copy ────────────────────────────────────────────────────────
    def materialize(self, plan: RolloutPlan, dest: Path, request: ExecutionRequest | None) -> MaterializedTask:
        """The per-rollout task copy. With the grader as verifier, the grader wheel and its
        installer travel in ``tests/`` and the verifier runs in a fresh sandbox
        (``isolate_verifier``): nothing the workflow did to its own sandbox can reach the reward.
        What every rollout of the task shares is prepared once (``tasks/prepared.py``) when the
        planner has a place for prepared copies; the rollout's own files are staged after."""
        grading_input = None
        grade_command = f"/bin/sh /tests/{GRADE_SCRIPT}" if plan.grader_verifies else None
        if plan.grader_verifies and request is not None:
            grading_input = GradingInput(
                rollout_id=request.id, label=request.label, metadata=request.metadata, prompt=list(request.prompt)
            ).model_dump(mode="json")
        instruction = None
        if request is not None and self.options.task_mode is TaskMode.TEMPLATE:
            instruction = render_prompt(request.prompt)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fresh, guarded = plan.fresh_verifier, plan.guard is not None
        prepare = functools.partial(self._prepare, plan.task, grade_command, fresh, guarded)
        if self._prepared is None or request is None:  # prewarm: one copy per task, nothing kept
            copy = prepare(dest)
        else:
            if dest.resolve().is_relative_to(plan.task.path.resolve()):
                raise ConfigError(f"materialize_task: destination {dest} is inside the task {plan.task.path}")
            key = (str(plan.task.path), grade_command, fresh, guarded)
            copy = self._prepared.link(key, plan.task.path, prepare, dest)
        return stage_rollout(copy, plan.task.task_id, instruction=instruction, grading_input=grading_input)

    def _prepare(
        self,
        task: ResolvedTask,
        grade_command: str | None,
        fresh: tuple[str, ...] | None,
        guarded: bool,
        dest: Path,
    ) -> MaterializedTask:
        """The copy every rollout of ``task`` shares: the task, its patched environment and,
        with the grader as verifier, the generated tests and the grader's installer; with a
        fresh verifier (``fresh``: what it carries), the task's verifier in Harbor's separate mode."""
        patch = None
        if self.bundle is not None and self.options.patch_dockerfile_with_sdk:
            guard = None
            if grade_command is None and guarded:
                platform = SandboxOptions.of(self.environment).platform
                guard = guard_binary(platform, config=self.options.settings)  # baked: no upload per trial
            patch = EnvironmentPatch(
                requirements=list(self.bundle.dependencies),
                wheel=self.bundle.wheel,
                bundle_key=self.bundle.key,
                guard=guard.path if guard else None,
                guard_sha256=guard.sha256 if guard else None,
            )
        copy = prepare_task(
            task,
            dest,
            grade_command=grade_command,
            environment_patch=patch,
            isolate_grader=True,
            grader_inputs=self.options.grader_inputs,
            keep_solution=self.options.is_native,  # Harbor's oracle agent is a native agent
            fresh_verifier=fresh,
        )
        if copy.generated_tests:
            try:
                self._stage_grader_install(copy.path / "tests", copy)
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)
                raise
        return copy

    def _stage_grader_install(self, tests_dir: Path, materialized: MaterializedTask) -> None:
        """Put the grader's launcher (and, unless the image bakes the bundle in, the wheel and
        its installer) next to the generated test.sh: Harbor uploads tests/ only at
        verification, so the agent phase never sees them. The verifier's fresh sandbox
        starts from the same image, so a baked one only checks the image's bundle marker."""
        assert self.bundle is not None and self.bundle.grade_script
        if materialized.bundle_baked is not None:
            setup = bundle_check_command(materialized.bundle_baked)
        else:
            shutil.copy2(self.bundle.wheel, tests_dir / self.bundle.wheel.name)
            wheel = PurePosixPath("/tests") / self.bundle.wheel.name
            setup = install_command(wheel, deps_preinstalled=materialized.environment_patched)
        script = tests_dir / GRADE_SCRIPT
        script.write_text(f"#!/bin/sh\n{setup}\nexec {VENV / 'bin' / self.bundle.grade_script}\n")
        script.chmod(0o755)

    # ── the trial ────────────────────────────────────────────────────────────
    def trial_config(
        self,
        plan: RolloutPlan,
        request: ExecutionRequest,
        *,
        work: Path,
        trial_name: str,
        trials_dir: Path,
        url: str,
        key_env: str,
    ) -> TrialConfig:
        materialized = self.materialize(plan, work / "task", request)
        sandbox = SandboxOptions.of(self.environment).for_trial(claims_pool=plan.claims_pool)
        return TrialConfig(
            task=TaskConfig(path=materialized.path),
            trial_name=trial_name,
            trials_dir=trials_dir,
            agent=(
                self._native_config(request, url, key_env)
                if self.options.is_native
                else self._workflow_config(request, work, materialized, plan)
            ),
            environment=sandbox.applied_to(self.environment),
            verifier=VerifierConfig(
                disable=plan.reward_source is RewardSource.NONE,
                override_timeout_sec=request.grader_timeout_sec,
            ),
            # Harbor 0.26 only (the option is refused on 0.25, where TrialConfig has no field).
            **({"override_error_policy": overrides} if (overrides := self.options.override_error_policy) else {}),
        )

    def _native_config(self, request: ExecutionRequest, url: str, key_env: str) -> AgentConfig:
        assert isinstance(self.options.agent, str)
        model = (request.metadata or {}).get("harbor_model") or self.options.model_name
        return native_agent_config(
            self.options.agent,
            chat_completions_url=url or None,
            api_key_env=key_env or "OSMOSIS_API_KEY",
            model_name=model,
            native_agent_kwargs=self.options.native_agent_kwargs,
            agent_timeout_sec=request.agent_timeout_sec,
            agent_setup_timeout_sec=self.options.agent_setup_timeout_sec,
        )

    def _workflow_config(
        self, request: ExecutionRequest, work: Path, materialized: MaterializedTask, plan: RolloutPlan
    ) -> AgentConfig:
        assert self.bundle is not None and self.bundle.agent_script
        rollout_input = work / "rollout_input.json"
        rollout_input.write_text(
            RolloutInput(
                rollout_id=request.id, prompt=list(request.prompt), metadata=request.metadata
            ).model_dump_json()
        )
        kwargs: dict[str, Any] = {
            "bundle_wheel": str(self.bundle.wheel),
            "agent_script": self.bundle.agent_script,
            "rollout_id": request.id,
            "rollout_input": str(rollout_input),
            "output_max_bytes": self.options.settings.exec_output_max_bytes,
            "contract_bounds": self._contract_bounds,
            "deps_preinstalled": materialized.environment_patched,
            "bundle_baked": materialized.bundle_baked,
            "steps": list(plan.steps) or None,
            "shim_timeout_sec": agent_timeout_budget(request.agent_timeout_sec),
        }
        return AgentConfig(
            import_path=WORKFLOW_AGENT,
            model_name=self.options.model_name,
            override_timeout_sec=request.agent_timeout_sec,
            override_setup_timeout_sec=self.options.agent_setup_timeout_sec,
            kwargs=kwargs,
        )
