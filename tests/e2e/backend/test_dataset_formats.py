"""HarborBackend on the task formats of public datasets, through the real osmosis server:
a multi-step task runs as one conversation in one sandbox, several reward channels reach
the sample's metrics, and what a sandbox cannot run is refused before any sandbox starts."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, managed_containers
from tests.support.rollout_server import client_for, serve

pytestmark = pytest.mark.slow

DATASET = FIXTURES / "rollout_dataset"


def _backend(tmp_path: Path, *, tasks_dir: Path = DATASET, mode: str = "dataset") -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=tasks_dir,
        task_mode=mode,
        agent="rollout_fixtures.workflows:OutputWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=None,  # the session's cache ($OSMOSIS_HARBOR_BUNDLES, tests/conftest.py)
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
    )


async def _rollout(client, chat: FakeChatServer, task_id: str | None, text: str = "Let's start."):
    return await client.run_rollout(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=chat.base_url,
        rollout_id=f"fmt-{uuid.uuid4().hex[:8]}",
        llm_api_key="sk-formats",
        metadata={"harbor_task_id": task_id} if task_id else None,
    )


@pytest.fixture
def chat():
    server = FakeChatServer()
    yield server
    server.close()


async def test_dataset_formats_through_the_server(
    tmp_path: Path, chat: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    async with serve(_backend(tmp_path)) as url, client_for(url) as client:
        two_step, multi_key, channels, compose = await asyncio.gather(
            *(_rollout(client, chat, task) for task in ("two-step", "multi-key", "channels-only", "compose"))
        )

    # Multi-step: each step's instruction is the next user turn of one conversation, in one
    # sandbox (step 2 doubles the number step 1 wrote); the reward is Harbor's mean over steps.
    assert two_step.status is RolloutStatus.SUCCESS, two_step.err_message
    sample = two_step.sample
    assert [m["role"] for m in sample.messages] == ["user", "user", "assistant", "tool", "user", "assistant", "tool"]
    assert sample.messages[1]["content"].startswith("Write 21 to answer.txt.")
    assert sample.messages[4]["content"].startswith("Now write twice the number")
    assert sample.reward == 1.0
    assert sample.metrics["step_reward/write"] == 1.0 and sample.metrics["step_reward/double"] == 1.0

    # Several channels: "reward" trains the policy, the others are metrics.
    assert multi_key.status is RolloutStatus.SUCCESS, multi_key.err_message
    assert multi_key.sample.reward == 1.0 and multi_key.sample.metrics["reward/brevity"] == 0.5

    # Channels without "reward": no scalar to train on, said plainly, channels still reported.
    assert channels.status is RolloutStatus.FAILURE
    assert "correctness, performance" in channels.err_message and '"reward"' in channels.err_message
    assert channels.sample.metrics["reward/correctness"] == 1.0

    assert compose.status is RolloutStatus.FAILURE and compose.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "multi-container tasks (environment/docker-compose.yaml) are not supported" in compose.err_message
    assert not managed_containers(owner_pid=os.getpid())


async def test_a_multi_step_template_is_refused_before_any_sandbox(
    tmp_path: Path, chat: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    async with (
        serve(_backend(tmp_path, tasks_dir=DATASET / "two-step", mode="template")) as url,
        client_for(url) as client,
    ):
        result = await _rollout(client, chat, None)
    assert result.status is RolloutStatus.FAILURE and result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "multi-step task" in result.err_message and "dataset mode" in result.err_message
    assert not managed_containers(owner_pid=os.getpid())
