"""README claims about ``HarborBackend`` end to end (real osmosis server, real sandboxes):

- a multi-step workflow sees ``ctx.metadata["harbor_step"]`` (``name``, ``index``, ``count``);
- a workflow failure in a step names the step;
- a step below its ``min_reward`` stops the trial (the next step never runs);
- ``grader_inputs=`` carries a path outside the agent's workdir to the isolated grader (and
  without it the grader does not see it: the control).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, managed_containers
from tests.support.common import graded_template as support_graded_template
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
DATASET = FIXTURES / "rollout_dataset"
WF = "rollout_fixtures.workflows"
GR = "rollout_fixtures.graders"


def _backend(tmp_path: Path, bundles_dir: Path, **kwargs: Any) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        code_dir=PROJECT,
        workflow_config=f"{WF}:fixture_config",
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
        **kwargs,
    )


async def _run(client: Any, chat: FakeChatServer, text: str, **kwargs: Any) -> Any:
    return await client.run_rollout(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=chat.base_url,
        rollout_id=f"claims-{uuid.uuid4().hex[:8]}",
        llm_api_key="sk-claims-test",
        **kwargs,
    )


def _steps_seen(sample: Any) -> list[dict[str, Any]]:
    return [
        json.loads(m["content"].removeprefix("harbor_step "))
        for m in sample.messages
        if m["role"] == "assistant" and str(m["content"]).startswith("harbor_step ")
    ]


async def test_multi_step_rollouts_through_the_backend(tmp_path: Path, bundles_dir: Path, fake_chat) -> None:
    backend = _backend(tmp_path, bundles_dir, tasks_dir=DATASET, task_mode="dataset", agent=f"{WF}:StepWorkflow")
    task = {"harbor_task_id": "two-step"}
    async with serve(backend) as url, client_for(url) as client:
        passed, failed, stopped = await asyncio.gather(
            _run(client, fake_chat, "go", metadata=task),
            _run(client, fake_chat, "go", metadata={**task, "fail_step": "double"}),
            _run(client, fake_chat, "go", metadata={**task, "spoil_step": "write"}),
        )
    # every step saw its harbor_step
    assert passed.status is RolloutStatus.SUCCESS, passed.err_message
    assert _steps_seen(passed.sample) == [
        {"name": "write", "index": 0, "count": 2},
        {"name": "double", "index": 1, "count": 2},
    ]
    assert passed.sample.reward == 1.0
    # a workflow failure names its step
    assert failed.status is RolloutStatus.FAILURE and failed.err_category is RolloutErrorCategory.AGENT_ERROR
    assert failed.err_message.startswith("step double: workflow failed"), failed.err_message
    assert "failing on purpose in double" in failed.err_message
    # write scored 0 < its min_reward 1.0: the trial stopped, double never ran
    assert stopped.status is RolloutStatus.SUCCESS, stopped.err_message
    assert _steps_seen(stopped.sample) == [{"name": "write", "index": 0, "count": 2}]
    assert stopped.sample.metrics["step_reward/write"] == 0.0
    assert "step_reward/double" not in stopped.sample.metrics
    assert not managed_containers(owner_pid=os.getpid())


@pytest.fixture
def graded_template(tmp_path: Path) -> Path:
    return support_graded_template(tmp_path)


async def test_grader_inputs_reach_the_isolated_grader(
    tmp_path: Path, bundles_dir: Path, fake_chat, graded_template: Path
) -> None:
    common = {
        "tasks_dir": graded_template,
        "task_mode": "template",
        "agent": f"{WF}:OutputWorkflow",
        "grader": f"{GR}:AnswerGrader",
        "grader_config": f"{GR}:evidence_grader_config",
    }
    text = "reply: mkdir -p /srv/evidence && echo 42 > /srv/evidence/answer.txt"
    named = _backend(tmp_path / "named", bundles_dir, grader_inputs=["/srv/evidence"], **common)
    unnamed = _backend(tmp_path / "unnamed", bundles_dir, **common)
    async with serve(named) as url_a, serve(unnamed) as url_b, client_for(url_a) as a, client_for(url_b) as b:
        with_inputs, without = await asyncio.gather(
            _run(a, fake_chat, text, label="42"), _run(b, fake_chat, text, label="42")
        )
    assert with_inputs.status is RolloutStatus.SUCCESS, with_inputs.err_message
    assert with_inputs.sample.reward == 1.0 and with_inputs.sample.metrics["answer_found"] == 1.0
    # the control: the same workflow, /srv/evidence not named, so the grader's sandbox lacks it
    assert without.status is RolloutStatus.SUCCESS, without.err_message
    assert without.sample.reward == 0.0 and without.sample.metrics["answer_found"] == 0.0
    assert not managed_containers(owner_pid=os.getpid())
