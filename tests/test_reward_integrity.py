"""A workflow that runs as root in its sandbox cannot write its own reward.

Each rollout answers wrong (``7`` for the label ``42``) and then attacks the grader's path
the way a reward-hacking policy would: rewriting the installed grader, replacing the grade
script, leaving a detached process that keeps rewriting ``/logs/verifier/reward.json``
(also while the grader itself fails), planting modules where a careless grader run would
import them, writing the reward file up front. Through the real osmosis server and real
Docker sandboxes, the reward must stay the grader's verdict on the wrong answer: 0.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .rollout_server import client_for, serve
from .sdk_paths import DOCKER, SdkPath
from .support import FIXTURES, TASKS, managed_containers

pytestmark = pytest.mark.slow

PROJECT = FIXTURES / "rollout_project"
ATTACKS = ["rewrite-grader", "replace-grade-script", "reward-rewriter", "shadow-modules", "reward-file-up-front"]


def _backend(tmp_path: Path, tasks_dir: Path, grader: str, sdk: SdkPath = DOCKER) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=tasks_dir,
        task_mode="template",
        agent="rollout_fixtures.workflows:HostileWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader=f"rollout_fixtures.graders:{grader}",
        grader_config="rollout_fixtures.graders:fixture_grader_config" if grader == "AnswerGrader" else None,
        code_dir=PROJECT,
        bundles_dir=tmp_path / "bundles",
        environment_config=sdk.environment(),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=False,
    )


@pytest.fixture
def graded_template(tmp_path: Path) -> Path:
    task = shutil.copytree(TASKS / "template", tmp_path / "template-graded")
    shutil.rmtree(task / "tests")
    return task


async def _attack(client, chat: FakeChatServer, attack: str):
    return await client.run_rollout(
        initial_messages=[{"role": "user", "content": f"Compute 6*7. attack: {attack}"}],
        chat_completions_url=chat.base_url,
        rollout_id=f"hostile-{attack}-{uuid.uuid4().hex[:6]}",
        llm_api_key="sk-hostile",
        label="42",
    )


async def test_a_root_workflow_cannot_forge_its_reward(
    tmp_path: Path, graded_template: Path, monkeypatch: pytest.MonkeyPatch, sandbox_sdk: SdkPath
) -> None:
    sandbox_sdk.require_loopback_endpoint()
    monkeypatch.setenv("HOME", str(tmp_path))
    chat = FakeChatServer()
    try:
        backend = _backend(tmp_path, graded_template, "AnswerGrader", sandbox_sdk)
        async with serve(backend) as url, client_for(url) as client:
            results = await asyncio.gather(*(_attack(client, chat, attack) for attack in ATTACKS))
    finally:
        chat.close()
    for attack, result in zip(ATTACKS, results, strict=True):
        assert result.status is RolloutStatus.SUCCESS, (attack, result.err_message)
        assert result.sample.reward == 0.0, f"{attack}: the workflow forged reward {result.sample.reward}"
        assert result.sample.metrics.get("answer_found") == 1.0, attack  # the grader really ran on "7"
    assert not managed_containers(owner_pid=os.getpid()), "sandboxes left behind"
    assert not sandbox_sdk.sandboxes_left(), "emulator sandboxes left behind"


async def test_a_failing_grader_is_a_failure_whatever_the_workflow_writes(
    tmp_path: Path, graded_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    chat = FakeChatServer()
    try:
        backend = _backend(tmp_path, graded_template, "RaisingGrader")
        async with serve(backend) as url, client_for(url) as client:
            result = await _attack(client, chat, "reward-rewriter-grader-raises")
    finally:
        chat.close()
    assert result.status is RolloutStatus.FAILURE, f"forged success, reward {result.sample and result.sample.reward}"
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR  # a ValueError, as LocalBackend says
    assert "the grader broke on purpose" in (result.err_message or "")


def test_the_grader_runs_in_a_sandbox_of_its_own(tmp_path: Path, graded_template: Path) -> None:
    """What the materialized copy tells Harbor: separate verifier, the agent's products as data."""
    from harbor.models.task.config import TaskConfig, VerifierEnvironmentMode

    from osmosis_harbor.tasks.refs import ResolvedTask

    backend = _backend(tmp_path, graded_template, "AnswerGrader")
    copy = backend.materialize(
        ResolvedTask(task_id="t", path=graded_template, source="template"), tmp_path / "copy", request=None
    ).path
    config = TaskConfig.model_validate_toml((copy / "task.toml").read_text())
    assert config.verifier.environment_mode is VerifierEnvironmentMode.SEPARATE
    assert config.artifacts == ["/logs/agent", "/workspace"]
    # the image bakes the bundle in: the fresh verifier sandbox checks its marker, installs nothing
    assert "/opt/osmosis/bundle.id" in (copy / "tests" / "osmosis_grade.sh").read_text()
    assert not list((copy / "tests").glob("*.whl"))
