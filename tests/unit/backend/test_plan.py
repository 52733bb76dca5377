"""The rollout plan (``backend/plan.py``): one request on one task decided once, before anything
is copied or started. Through ``Planner.plan`` only, on the
fake SDK's environment config, so nothing here builds, copies or starts."""

from __future__ import annotations

from pathlib import Path

from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.backend.outcome import RewardSource
from osmosis_harbor.backend.plan import Planner, Refusal, RolloutPlan
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.tasks.refs import ResolvedTask
from osmosis_harbor.tasks.verification import VerificationMode
from tests.unit.fake_sky.fixtures import FAKE_IMAGE, FAKE_SDK

REQUEST = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "do it"}])
UNGRADED = ExecutionRequest(id="r2", prompt=[{"role": "user", "content": "do it"}], grade=False)


def _task(root: Path, name: str = "t1", *, tests: bool = True, toml: str = "") -> ResolvedTask:
    path = root / name
    (path / "environment").mkdir(parents=True)
    (path / "instruction.md").write_text("Do it.\n")
    (path / "task.toml").write_text(
        f'schema_version = "1.4"\n[environment]\ndocker_image = "{FAKE_IMAGE}"\n[verifier]\ntimeout_sec = 60.0\n{toml}'
    )
    if tests:
        (path / "tests").mkdir()
        (path / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    return ResolvedTask(task_id=name, path=path, source="local")


def _planner(tmp_path: Path, *, pools: dict[str, str] | None = None, **options: object) -> Planner:
    environment = environment_config(FAKE_SDK, **options.pop("environment", {}))  # type: ignore[arg-type]
    parsed = BackendOptions.parse(
        orchestrator=TrialQueue(1), tasks_dir=tmp_path, agent="oracle", environment_config=environment, **options
    )
    return Planner(parsed, None, environment, pools or {})


def _plan(planner: Planner, task: ResolvedTask, request: ExecutionRequest | None = REQUEST) -> RolloutPlan:
    plan = planner.plan(task, request)
    assert isinstance(plan, RolloutPlan), plan
    return plan


def test_a_tasks_own_tests_win_over_the_grader_and_run_in_a_fresh_sandbox(tmp_path: Path) -> None:
    plan = _plan(_planner(tmp_path, grader="some.module:Grader"), _task(tmp_path))
    assert plan.reward_source is RewardSource.TASK_TESTS and not plan.grader_verifies
    assert plan.verification is not None and plan.verification.mode is VerificationMode.FRESH
    assert plan.fresh_verifier is not None and plan.verifier_sandbox and plan.guard is None


def test_without_tests_the_grader_verifies_in_a_sandbox_of_its_own(tmp_path: Path) -> None:
    plan = _plan(_planner(tmp_path, grader="some.module:Grader"), _task(tmp_path, tests=False))
    assert plan.reward_source is RewardSource.GRADER and plan.grader_verifies and plan.verifier_sandbox
    assert plan.verification is None and plan.fresh_verifier is None


def test_without_tests_or_grader_a_graded_request_is_refused_by_name(tmp_path: Path) -> None:
    refusal = _planner(tmp_path).plan(_task(tmp_path, tests=False), REQUEST)
    assert isinstance(refusal, Refusal) and "no tests/test.sh and no grader=" in refusal.message
    assert refusal.extra["failed_phase"] == "task"
    # An ungraded request, or prewarm's plan of a rollout to come, needs no verifier.
    assert _plan(_planner(tmp_path), _task(tmp_path, "t2", tests=False), UNGRADED).reward_source is RewardSource.NONE
    assert _plan(_planner(tmp_path), _task(tmp_path, "t3", tests=False), None).reward_source is RewardSource.NONE


def test_an_ungraded_request_has_no_verifier_even_with_tests(tmp_path: Path) -> None:
    plan = _plan(_planner(tmp_path), _task(tmp_path), UNGRADED)
    assert plan.reward_source is RewardSource.NONE and not plan.verifier_sandbox and plan.verification is None


def test_a_task_declaring_a_shared_verifier_runs_its_tests_under_the_guard(tmp_path: Path) -> None:
    task = _task(tmp_path, toml='environment_mode = "shared"\n')
    plan = _plan(_planner(tmp_path), task)
    assert plan.verification is not None and plan.verification.mode is VerificationMode.SHARED
    assert plan.guard is not None and plan.fresh_verifier is None and not plan.verifier_sandbox


def test_a_multi_step_task_keeps_its_steps_and_one_guarded_sandbox(tmp_path: Path) -> None:
    task = _task(tmp_path, toml='\n[[steps]]\nname = "one"\n\n[[steps]]\nname = "two"\n')
    plan = _plan(_planner(tmp_path, task_mode="dataset"), task)
    assert plan.steps == ("one", "two") and plan.reward_source is RewardSource.TASK_TESTS
    assert plan.verification is not None and plan.verification.mode is VerificationMode.SHARED


def test_the_trial_claims_from_a_pool_only_where_prewarm_made_one_for_its_task(tmp_path: Path) -> None:
    planner = _planner(tmp_path, pools={"t1": "warm-t1"})
    assert _plan(planner, _task(tmp_path, "t1")).claims_pool
    assert not _plan(planner, _task(tmp_path, "t2")).claims_pool
