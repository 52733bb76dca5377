"""A graded rollout's separate verifier sandbox is created while the agent runs, and taken by
the verifier; one nobody takes is terminated; the setting turns it off.

Real osmosis server and client, real sandboxes, on both SDK paths. What is observed is the
head start's own record (``HeadStart.begin`` and ``take``, wrapped to note their calls): the
head start is begun when the agent's sandbox is up (before the workflow runs), the verifier ran
in the head-started sandbox, and afterwards no sandbox of the rollout remains. The reward
integrity attacks (``test_reward_integrity.py``) run with the head start on, its default.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.agents.workflow import WorkflowAgent
from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment
from osmosis_harbor.sandbox.owner import head_start as head_start_module
from tests.support.backends import make_backend
from tests.support.common import graded_template, managed_containers
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER, DOCKER_PATH_ONLY, SdkPath

pytestmark = pytest.mark.slow

WORKDIR = "/workspace"  # the template task's, carried to the verifier as an artifact


async def run(client: Any, fake_chat: Any, api_key: str, text: str, **kwargs: Any) -> Any:
    return await client.run_rollout(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=fake_chat.base_url,
        rollout_id=f"r-{uuid.uuid4().hex[:10]}",
        llm_api_key=api_key,
        **kwargs,
    )


@pytest.fixture
def api_key() -> str:
    return f"sk-test-{uuid.uuid4().hex}"


@pytest.fixture
def graded_task(tmp_path: Path) -> Path:
    """The bundled template without tests/, so the Osmosis grader verifies in its own sandbox."""
    return graded_template(tmp_path)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What the head starts and the workflow agent did, in order."""
    seen: list[tuple[str, Any]] = []
    cls = head_start_module.HeadStart
    begin, take = cls.begin, cls.take

    def noted_begin(self: Any, agent_session: str, shape: Any, create: Any, end: Any) -> None:
        seen.append(("begin", agent_session))
        begin(self, agent_session, shape, create, end)

    async def noted_take(self: Any, shape: Any) -> Any:
        asked = self.free  # only a verifier's create asks (its trial context's role)
        created = await take(self, shape)
        if asked:
            seen.append(("take", created[0] if created is not None else None))
        return created

    run_agent = WorkflowAgent.run
    exec_command = SandboxEnvironment.exec

    async def noted_exec(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        if "__verifier__" in self.session_id and WORKDIR in command:  # a command that reached the sandbox
            seen.append(("verifier command on the workdir", command))
        return await exec_command(self, command, *args, **kwargs)

    async def noted_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(("workflow starts", None))
        return await run_agent(self, *args, **kwargs)

    monkeypatch.setattr(cls, "begin", noted_begin)
    monkeypatch.setattr(cls, "take", noted_take)
    monkeypatch.setattr(WorkflowAgent, "run", noted_run)
    monkeypatch.setattr(SandboxEnvironment, "exec", noted_exec)
    return seen


def _left(sdk: SdkPath) -> list[str]:
    """Sandboxes of this path still on the engine (pool members aside)."""
    if sdk.is_emulator:
        return sdk.sandboxes_left()
    return [c["Names"][0].lstrip("/") for c in managed_containers(os.getpid())]


@DOCKER_PATH_ONLY
async def test_the_verifier_runs_in_the_head_started_sandbox_and_one_nobody_takes_is_terminated(
    tmp_path, bundles_dir, fake_chat, api_key, graded_task, events, sandbox_sdk: SdkPath
):
    """Two graded rollouts, one after the other: each verifier takes the sandbox begun while its
    agent ran. Then a third whose workflow fails (``fail: raise``), so no verifier runs: its
    head-started sandbox must not outlive the rollout. One backend (``FailingWorkflow``)."""
    sandbox_sdk.require_loopback_endpoint()
    backend = make_backend(
        tmp_path, bundles_dir, agent="FailingWorkflow", grader="AnswerGrader", tasks_dir=graded_task, sdk=sandbox_sdk
    )
    async with serve(backend) as url, client_for(url) as client:
        right = await run(client, fake_chat, api_key, "Write 42 to answer.txt\nreply: echo 42 > answer.txt", label="42")
        wrong = await run(client, fake_chat, api_key, "Write 7 to answer.txt\nreply: echo 7 > answer.txt", label="42")
        taken = list(events)
        failed = await run(client, fake_chat, api_key, "go\nfail: raise", label="42")
    assert right.status is RolloutStatus.SUCCESS, right.err_message
    assert right.sample.reward == 1.0 and wrong.sample.reward == 0.0  # the grader's verdicts
    # the head start emptied the workdir early: the verifier's own emptying never reached its sandbox
    assert [kind for kind, _ in taken] == ["begin", "workflow starts", "take"] * 2, taken
    heads = [value for kind, value in taken if kind == "take"]
    assert all(name and "verifier" in name and name.endswith("head") for name in heads), heads
    assert failed.status is RolloutStatus.FAILURE and failed.err_category is RolloutErrorCategory.AGENT_ERROR
    assert "broke on purpose" in (failed.err_message or ""), failed.err_message
    assert [kind for kind, _ in events[len(taken) :]] == ["begin", "workflow starts"], events  # begun, never taken
    assert _left(sandbox_sdk) == []


async def test_the_setting_turns_the_head_start_off(
    tmp_path, bundles_dir, fake_chat, api_key, graded_task, events, monkeypatch
):
    monkeypatch.setenv("OSMOSIS_HARBOR_VERIFIER_HEAD_START", "0")
    # Harbor's own transfer path, on which its emptying of the workdir is a command of its own (on
    # the default route it rides the verifier's upload with or without a head start)
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    backend = make_backend(
        tmp_path, bundles_dir, agent="OutputWorkflow", grader="AnswerGrader", tasks_dir=graded_task, sdk=DOCKER
    )
    async with serve(backend) as url, client_for(url) as client:
        right = await run(client, fake_chat, api_key, "Write 42 to answer.txt\nreply: echo 42 > answer.txt", label="42")
    assert right.status is RolloutStatus.SUCCESS and right.sample.reward == 1.0, right.err_message
    # positive control: without a head start the verifier empties the workdir with a command
    assert [kind for kind, _ in events] == ["workflow starts", "verifier command on the workdir"], events
    assert _left(DOCKER) == []
