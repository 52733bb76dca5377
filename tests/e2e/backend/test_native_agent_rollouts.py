"""Native Harbor agents through HarborBackend and the real osmosis server: the oracle over a
dataset, and terminus-2 wired to the rollout's endpoint, graded by the task's tests or by
a bundled Osmosis grader installed for the verifier phase only."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.agents.native import NotTrainableWarning
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

TERMINUS_REPLY = json.dumps(
    {
        "analysis": "answer.txt is missing.",
        "plan": "Write osmosis into it and finish.",
        "commands": [{"keystrokes": "echo osmosis > /workspace/answer.txt\n", "duration": 0.1}],
        "task_complete": True,
    }
)


async def test_oracle_validates_a_dataset_through_the_backend(tmp_path: Path) -> None:
    with pytest.warns(NotTrainableWarning):
        backend = HarborBackend(
            orchestrator=TrialQueue(n_concurrent=2),
            tasks_dir=TASKS,
            task_mode="dataset",
            agent="oracle",
            environment_config=environment_config("docker"),
            trials_dir=tmp_path / "trials",
        )
    assert backend.bundle is None
    async with serve(backend) as url, client_for(url) as client:
        results = await asyncio.gather(  # both at once: the queue has a slot for each
            *(
                client.run_rollout(
                    initial_messages=[{"role": "user", "content": "validate"}],
                    chat_completions_url="http://unused.invalid/v1",
                    rollout_id=f"oracle-{uuid.uuid4().hex[:8]}",
                    metadata={"harbor_task_id": task_id},
                )
                for task_id in ("json-reward", "files/workdir-task")
            )
        )
    for result in results:
        assert result.status is RolloutStatus.SUCCESS, result.err_message
        assert result.sample.reward == 1.0


@pytest.mark.parametrize("graded_by", ["task_tests", "grader"])
async def test_terminus_2_rollout_through_the_backend(tmp_path: Path, graded_by: str) -> None:
    server = FakeChatServer(default_reply=TERMINUS_REPLY)
    key = f"sk-native-{uuid.uuid4().hex}"
    tasks_dir = TASKS / "template"
    grader = None
    if graded_by == "grader":
        tasks_dir = shutil.copytree(TASKS / "template", tmp_path / "graded-template")
        shutil.rmtree(tasks_dir / "tests")
        grader = "rollout_fixtures.graders:AnswerGrader"
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=tasks_dir,
        agent="terminus-2",
        grader=grader,
        grader_config="rollout_fixtures.graders:fixture_grader_config" if grader else None,
        code_dir=FIXTURES / "rollout_project" if grader else None,
        bundles_dir=None,  # the session's cache ($OSMOSIS_HARBOR_BUNDLES, tests/conftest.py)
        native_agent_kwargs={"max_turns": 5, "api_base": "http://elsewhere.invalid"},  # wiring must win
        # terminus-2 calls the model from the host: a loopback endpoint needs no host network
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=False,
    )
    try:
        async with serve(backend) as url, client_for(url) as client:
            result = await client.run_rollout(
                initial_messages=[{"role": "user", "content": "Write osmosis into /workspace/answer.txt."}],
                chat_completions_url=server.base_url,
                rollout_id=f"t2-{uuid.uuid4().hex[:8]}",
                llm_api_key=key,
                label="osmosis",
                metadata={"harbor_model": "openai/policy-v7"},
            )
    finally:
        server.close()
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.reward == 1.0
    assert [m["role"] for m in result.sample.messages][:2] == ["user", "assistant"]
    assert "Write osmosis into /workspace/answer.txt." in result.sample.messages[0]["content"]
    if graded_by == "grader":
        assert result.sample.metrics.get("answer_found") == 1.0
    assert server.requests and all(r.authorization == f"Bearer {key}" for r in server.requests)
    assert {r.body["model"] for r in server.requests} == {"policy-v7"}
    for path in (tmp_path / "trials").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
