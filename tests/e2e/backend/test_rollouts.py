"""HarborBackend end to end: the real osmosis rollout server on 127.0.0.1, the osmosis
client polling for results, real trials in Docker sandboxes through Harbor's TrialQueue,
and a fake chat endpoint on 127.0.0.1 that the workflow calls from inside the sandbox."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from harbor.models.trial.config import EnvironmentConfig
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.sandbox.environment.sandbox_environment import IMPORT_PATH as SANDBOX_ENVIRONMENT
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.backends import make_backend
from tests.support.common import TASKS, graded_template, managed_containers
from tests.support.rollout_server import client_for, http_to, serve
from tests.support.sdk_paths import SdkPath
from tests.unit.tasks.test_prepared_copies import assert_prepared_unchanged

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


@pytest.fixture
def api_key() -> str:
    return f"sk-test-{uuid.uuid4().hex}"


@pytest.fixture
def grader_template(tmp_path: Path) -> Path:
    """The bundled template without tests/, so the Osmosis grader is the verifier."""
    return graded_template(tmp_path)


def prompt(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assert_secret_absent(secret: str, *roots: Path) -> None:
    needle = secret.encode()
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert needle not in path.read_bytes(), f"API key leaked into {path}"


async def run(client, fake_chat: FakeChatServer, api_key: str, text: str, **kwargs):
    return await client.run_rollout(
        initial_messages=prompt(text),
        chat_completions_url=fake_chat.base_url,
        rollout_id=kwargs.pop("rollout_id", f"r-{uuid.uuid4().hex[:10]}"),
        llm_api_key=api_key,
        **kwargs,
    )


async def test_template_mode_with_grader(
    tmp_path, bundles_dir, fake_chat, api_key, grader_template, osmosis_home, sandbox_sdk: SdkPath
):
    """A graded rollout (right and wrong answers) and an ungraded one, on both sandbox paths."""
    sandbox_sdk.require_loopback_endpoint()
    routes = sandbox_sdk.routes()
    backend = make_backend(
        tmp_path, bundles_dir, agent="OutputWorkflow", grader="AnswerGrader", tasks_dir=grader_template, sdk=sandbox_sdk
    )
    async with serve(backend) as url, client_for(url) as client:
        right, wrong, ungraded = await asyncio.gather(
            run(client, fake_chat, api_key, "Write 42 to answer.txt\nreply: echo 42 > answer.txt", label="42"),
            run(client, fake_chat, api_key, "Write 7 to answer.txt\nreply: echo 7 > answer.txt", label="42"),
            run(client, fake_chat, api_key, "Write 42\nreply: echo 42 > answer.txt", label="42", grade=False),
        )
        # each rollout's copy was linked from one prepared per plan shape, and rewritten with the
        # rollout's prompt and grading input: the prepared copies are as a fresh preparation
        assert assert_prepared_unchanged(backend, tmp_path) == 2
    assert right.status is RolloutStatus.SUCCESS, right.err_message
    assert right.sample.reward == 1.0
    assert right.sample.metrics == {"commands": 1.0, "answer_found": 1.0}
    assert right.sample.extra_fields["graded_by"] == "AnswerGrader"
    roles = [m["role"] for m in right.sample.messages]
    assert roles == ["user", "assistant", "tool"] and right.sample.messages[1]["content"] == "echo 42 > answer.txt"
    assert wrong.status is RolloutStatus.SUCCESS and wrong.sample.reward == 0.0
    assert ungraded.status is RolloutStatus.SUCCESS and ungraded.sample.reward is None
    assert ungraded.sample.metrics == {"commands": 1.0}  # the grader never ran
    # the policy was reached from inside the sandbox, with the rollout's key
    assert {r.authorization for r in fake_chat.requests} >= {f"Bearer {api_key}"}
    # template mode: the instruction the sandbox saw is the prompt (the artifact log proves the command ran)
    artifacts = list((tmp_path / "trials").rglob("command.log"))
    assert artifacts and any("echo 42 > answer.txt" in p.read_text() for p in artifacts)
    assert_secret_absent(api_key, tmp_path / "trials", osmosis_home)
    sandbox_sdk.assert_harbors_transfer_path(routes)
    assert sandbox_sdk.sandboxes_left() == []


async def test_task_tests_win_over_the_grader(tmp_path, bundles_dir, fake_chat, api_key):
    backend = make_backend(tmp_path, bundles_dir, agent="ListWorkflow", grader="AnswerGrader")
    async with serve(backend) as url, client_for(url) as client:
        result = await run(
            client,
            fake_chat,
            api_key,
            "Write osmosis\nreply: echo osmosis > answer.txt",
            label="not-what-the-grader-wants",
        )
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.reward == 1.0  # the task's own test.sh, not AnswerGrader (which would give 0)
    assert "answer_found" not in result.sample.metrics
    assert [m["role"] for m in result.sample.messages] == ["user", "assistant", "tool"]


async def test_dataset_mode_with_task_tests_and_bad_ids(tmp_path, bundles_dir, fake_chat, api_key):
    backend = make_backend(tmp_path, bundles_dir, agent="NoneWorkflow", tasks_dir=TASKS, task_mode="dataset")
    solve = (
        "python3 -c \"import json; n=[int(x) for x in open('/data/numbers.txt')]; "
        "json.dump(dict(count=len(n), sum=sum(n), mean=sum(n)/len(n)), open('/output/stats.json','w'))\""
    )
    async with serve(backend) as url, client_for(url) as client:
        solved, escape, unknown, no_python = await asyncio.gather(
            run(client, fake_chat, api_key, f"reply: {solve}", metadata={"harbor_task_id": "json-reward"}),
            run(client, fake_chat, api_key, "hi", metadata={"harbor_task_id": "../tests/fixtures/broken/reward-zero"}),
            run(client, fake_chat, api_key, "hi", metadata={"harbor_task_id": "files/no-such-task"}),
            run(client, fake_chat, api_key, "hi", metadata={"harbor_task_id": "hello-reward-txt"}),
        )
    assert solved.status is RolloutStatus.SUCCESS, solved.err_message
    # the extra reward channel of json-reward's reward.json reaches the metrics beside the workflow's own;
    # its tests ran in a fresh sandbox of its image, so no guard gave a verdict
    assert solved.sample.reward == 1.0 and solved.sample.metrics == {
        "registered": 1.0,
        "reward/fields_correct": 1.0,
    }
    for bad in (escape, unknown):
        assert bad.status is RolloutStatus.FAILURE
        assert bad.err_category is RolloutErrorCategory.VALIDATION_ERROR, bad.err_message
    assert "harbor_task_id" in escape.err_message and "files/no-such-task" in unknown.err_message
    # a debian image without python3 cannot run a workflow bundle: said plainly
    assert no_python.status is RolloutStatus.FAILURE
    assert no_python.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "python3" in no_python.err_message


# (prompt's last line, label, per-rollout agent timeout) -> (category, what the message says)
WORKFLOW_FAILURES = {
    ("fail: raise", "x", None): (RolloutErrorCategory.AGENT_ERROR, "broke on purpose"),
    ("fail: invalid-output", "x", None): (RolloutErrorCategory.VALIDATION_ERROR, "metrics.bad"),
    ("fail: sleep", "x", 4.0): (RolloutErrorCategory.TIMEOUT, "timed out"),
}
# Failed workflows the verifier would never grade: sent ungraded, so no verifier's sandbox is
# head-started for them (the raising one stays graded: a graded rollout's workflow failure)
UNGRADED = {("fail: invalid-output", "x", None), ("fail: sleep", "x", 4.0)}
GRADER_FAILURES = {
    ("reply: echo 42 > answer.txt", "raise", None): (RolloutErrorCategory.VALIDATION_ERROR, "broke on purpose"),
    ("reply: echo 42 > answer.txt", "silent", None): (
        RolloutErrorCategory.VALIDATION_ERROR,
        "Sample has no reward after grading",
    ),
}


async def test_workflow_and_grader_failures_map_to_categories(
    tmp_path, bundles_dir, fake_chat, api_key, grader_template
):
    """A raising workflow, an invalid output, a workflow past its timeout; a raising grader and
    one that sets no reward (the verifier's failures: the agent's sample survives). One backend
    runs them all at once: ``FailingWorkflow`` and ``FailingGrader`` fail as the prompt's last
    line or the label says, each as ``RaisingWorkflow``, ``InvalidOutputWorkflow``,
    ``SleepyWorkflow``, ``RaisingGrader`` or ``SilentGrader`` would as the backend's own."""
    cases = {**WORKFLOW_FAILURES, **GRADER_FAILURES}
    backend = make_backend(
        tmp_path,
        bundles_dir,
        agent="FailingWorkflow",
        grader="FailingGrader",
        tasks_dir=grader_template,
        orchestrator=TrialQueue(n_concurrent=len(cases)),
    )
    async with serve(backend) as url, client_for(url) as client:
        results = await asyncio.gather(
            *(
                run(
                    client,
                    fake_chat,
                    api_key,
                    f"do it\n{line}",
                    label=label,
                    agent_timeout_sec=timeout,
                    grade=(line, label, timeout) not in UNGRADED,
                )
                for line, label, timeout in cases
            )
        )
    for (case, (category, needle)), result in zip(cases.items(), results, strict=True):
        assert result.status is RolloutStatus.FAILURE, (case, result)
        assert result.err_category is category, (case, result.err_message)
        assert needle in result.err_message, (case, result.err_message)
        if case in GRADER_FAILURES:
            assert result.sample is not None and result.sample.reward is None, case  # the agent's sample survives
    assert_secret_absent(api_key, tmp_path / "trials")


async def test_key_printed_by_a_workflow_is_not_retained(tmp_path, bundles_dir, fake_chat, api_key, osmosis_home):
    backend = make_backend(tmp_path, bundles_dir, agent="KeyLeakingWorkflow")
    async with serve(backend) as url, client_for(url) as client:
        result = await run(client, fake_chat, api_key, "hello", grade=False)
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    logs = list((tmp_path / "trials").rglob("workflow.log"))
    assert logs and "my key is ***" in logs[0].read_text()
    assert_secret_absent(api_key, tmp_path / "trials", osmosis_home)


async def test_loopback_endpoint_is_refused_where_sandboxes_cannot_reach_it(tmp_path, bundles_dir, fake_chat, api_key):
    """SkyPilot sandboxes cannot reach this machine (no relay): the endpoint must be public."""
    skypilot = EnvironmentConfig(import_path=SANDBOX_ENVIRONMENT, kwargs={"sdk": "skypilot"})
    backend = make_backend(tmp_path, bundles_dir, agent="OutputWorkflow", environment=skypilot)
    before = len(managed_containers(owner_pid=os.getpid()))
    async with serve(backend) as url, client_for(url) as client:
        result = await run(client, fake_chat, api_key, "hello", grade=False)
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "loopback" in result.err_message and "'skypilot' sandboxes cannot reach" in result.err_message
    assert len(managed_containers(owner_pid=os.getpid())) == before
    assert not (tmp_path / "trials").exists() or not any((tmp_path / "trials").iterdir())


async def test_status_transitions_and_a_grader_timeout_through_the_server(
    tmp_path, bundles_dir, fake_chat, api_key, grader_template
):
    """On one backend with the slow grader: a rollout observed through running, grading and
    success; beside it, one whose grader outlives its timeout ends ``timeout``."""
    backend = make_backend(
        tmp_path, bundles_dir, agent="OutputWorkflow", grader="SlowGrader", tasks_dir=grader_template
    )
    async with serve(backend) as url, client_for(url) as client, http_to(url) as http:
        timed_out = asyncio.ensure_future(
            run(client, fake_chat, api_key, "reply: echo 42 > answer.txt", label="42", grader_timeout_sec=1.5)
        )
        handle = await client.run_rollout_async(
            initial_messages=prompt("reply: echo 42 > answer.txt"),
            chat_completions_url=fake_chat.base_url,
            rollout_id="observed-1",
            llm_api_key=api_key,
            label="42",
        )
        assert await handle.wait_for_running() in {RolloutStatus.RUNNING, RolloutStatus.GRADING}
        assert await handle.wait_for_grading() is RolloutStatus.GRADING
        status = (await http.get("/rollout/observed-1/status")).json()
        assert status["status"] == "grading" and status["task_id"] == "template-graded"
        result = await handle.wait_for_completion()
        assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0
        final = (await http.get("/rollout/observed-1/status")).json()
        assert final["status"] == "success" and final["reward"] == 1.0
        assert (await http.get("/rollout/never-seen/status")).status_code == 404
        timeout = await timed_out
    assert timeout.status is RolloutStatus.FAILURE
    assert timeout.err_category is RolloutErrorCategory.TIMEOUT, timeout.err_message
    assert "verifier timed out" in timeout.err_message


async def test_bad_prompt_is_a_validation_error_and_leaves_no_queued_state(tmp_path, bundles_dir, fake_chat, api_key):
    backend = make_backend(tmp_path, bundles_dir, agent="OutputWorkflow")
    async with serve(backend) as url, client_for(url) as client:
        result = await client.run_rollout(
            initial_messages=[],
            chat_completions_url=fake_chat.base_url,
            rollout_id="empty-prompt",
            llm_api_key=api_key,
            grade=False,
        )
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR, result.err_message
    assert backend.rollout_status("empty-prompt")["status"] == RolloutStatus.FAILURE
    assert backend.health()["in_flight"] == 0


async def test_per_rollout_task_ref_overrides_the_template(tmp_path, bundles_dir, fake_chat, api_key):
    # template: tasks/template; its siblings are allowed explicitly (only tasks_dir is by default)
    backend = make_backend(tmp_path, bundles_dir, agent="ListWorkflow", task_roots=[TASKS])
    solve = (
        "python3 -c \"import json; n=[int(x) for x in open('/data/numbers.txt')]; "
        "json.dump(dict(count=len(n), sum=sum(n), mean=sum(n)/len(n)), open('/output/stats.json','w'))\""
    )
    async with serve(backend) as url, client_for(url) as client:
        result = await run(
            client, fake_chat, api_key, f"reply: {solve}", metadata={"harbor_task": "../json-reward"}
        )  # a local ref, beside the template
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.reward == 1.0  # json-reward's own tests graded it
