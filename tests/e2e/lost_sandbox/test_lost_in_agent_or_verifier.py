"""A sandbox lost to the infrastructure is not the workflow's failure, through the real server.

The test plays the infrastructure: it finds the rollout's sandbox by its labels and kills or
removes it while the workflow (or the task's tests) wait on a FIFO in /tmp, which is also how
the test knows they are running. Opening the FIFO lets a retried attempt finish. No sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest
from harbor.environments.skypilot import _sanitize_dns_name
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS, managed_containers, wait_until
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
AGENT_GATE = "/tmp/agent-gate"
GRADING_GATE = "/tmp/grading-gate"
# A separate verifier's sandbox: created ahead while the agent runs (the head start), or by
# Harbor when the verification starts (Harbor's session ``{trial}__verifier__{key}``).
VERIFIER_SESSIONS = ("__env__verifier__head", "__verifier__trial")
# The workflow asks the policy for this command and runs it: it blocks until the gate opens.
BLOCKING_REPLY = f"reply: mkfifo {AGENT_GATE} && read x < {AGENT_GATE} && echo 42 > answer.txt"
# The workflow's process kills itself with SIGKILL: exit 137 from a sandbox that still runs.
SELF_KILL_REPLY = "reply: kill -9 $PPID"


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    """``graded``: the template without tests (the Osmosis grader gives the reward);
    ``blocking-tests``: the template whose own tests wait on a gate before rewarding."""
    root = tmp_path / "tasks"
    graded = shutil.copytree(TASKS / "template", root / "graded")
    shutil.rmtree(graded / "tests")
    blocking = shutil.copytree(TASKS / "template", root / "blocking-tests")
    (blocking / "tests" / "test.sh").write_text(
        f"#!/bin/bash\nmkdir -p /logs/verifier\nmkfifo {GRADING_GATE} && read x < {GRADING_GATE}\n"
        "echo 1 > /logs/verifier/reward.txt\n"
    )
    return root


def make_backend(tmp_path: Path, tasks: Path, sdk: SdkPath = DOCKER, **kwargs) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=tasks / "graded",
        task_mode="template",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader="rollout_fixtures.graders:AnswerGrader",
        grader_config="rollout_fixtures.graders:fixture_grader_config",
        code_dir=PROJECT,
        bundles_dir=None,  # the session's cache ($OSMOSIS_HARBOR_BUNDLES, tests/conftest.py)
        trials_dir=tmp_path / "trials",
        environment_config=sdk.environment(),
        **kwargs,
    )


def engine():
    return docker.from_env().api


def sandbox_of(
    backend: HarborBackend, rollout_id: str, owner_pid: int | None = None, sessions: tuple[str, ...] = ("__env",)
) -> dict | None:
    """The running container of the rollout's current trial, found by its labels (its owner:
    this process, or on the emulator path the emulator server): the agent's (Harbor's session
    ``{trial}__env``) or, with ``VERIFIER_SESSIONS``, its separate verifier's."""
    status = backend.rollout_status(rollout_id)
    if not status or not status.get("trial_name"):
        return None
    names = {_sanitize_dns_name(f"hb-{status['trial_name']}{session}") for session in sessions}
    for container in managed_containers(owner_pid=owner_pid or os.getpid()):
        if container["Labels"].get(L.SANDBOX) in names and container["State"] == "running":
            return container
    return None


def in_sandbox(container_id: str, *argv: str) -> int:
    api = engine()
    try:
        exec_id = api.exec_create(container_id, list(argv))["Id"]
        api.exec_start(exec_id)
        return int(api.exec_inspect(exec_id)["ExitCode"])
    except docker.errors.APIError:  # the container went away while we looked
        return -1


async def waiting_at(
    backend: HarborBackend,
    rollout_id: str,
    gate: str,
    *,
    not_in: set[str] = frozenset(),
    owner_pid: int | None = None,
    sessions: tuple[str, ...] = ("__env",),
) -> dict:
    """The rollout's sandbox (``sandbox_of``) once its workflow or tests wait at ``gate`` (a FIFO)."""

    def ready() -> dict | None:
        container = sandbox_of(backend, rollout_id, owner_pid, sessions)
        if container is None or container["Id"] in not_in:
            return None
        return container if in_sandbox(container["Id"], "test", "-p", gate) == 0 else None

    return await asyncio.to_thread(wait_until, ready, timeout=180, what=f"{rollout_id} waiting at {gate}")


def gone(container_id: str) -> bool:
    try:
        engine().inspect_container(container_id)
    except docker.errors.NotFound:
        return True
    return False


def diagnostics(home: Path, rollout_id: str) -> dict:
    """The outcome's extra_fields, as the osmosis server saved them."""
    (path,) = home.rglob(f"{rollout_id}/diagnostics.json")
    return json.loads(path.read_text())


async def start(client, fake_chat: FakeChatServer, rollout_id: str, text: str, **kwargs):
    return await client.run_rollout_async(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=fake_chat.base_url,
        rollout_id=rollout_id,
        llm_api_key="sk-lost-sandbox-test",
        label="42",
        **kwargs,
    )


async def test_a_lost_sandbox_is_an_internal_error_and_a_self_kill_is_the_workflows(
    tmp_path, tasks, fake_chat, osmosis_home, sandbox_sdk: SdkPath
):
    sandbox_sdk.require_loopback_endpoint()
    owner = sandbox_sdk.owner_pid
    backend = make_backend(tmp_path, tasks, sandbox_sdk, task_roots=[tasks])  # ../blocking-tests, beside the template
    ids = {k: f"{k}-{uuid.uuid4().hex[:6]}" for k in ("killed", "self", "grading")}
    async with serve(backend) as url, client_for(url) as client:
        killed = await start(client, fake_chat, ids["killed"], BLOCKING_REPLY)
        self_kill = await start(client, fake_chat, ids["self"], SELF_KILL_REPLY)
        grading = await start(
            client, fake_chat, ids["grading"], "reply: echo hi", metadata={"harbor_task": "../blocking-tests"}
        )
        victim = await waiting_at(backend, ids["killed"], AGENT_GATE, owner_pid=owner)
        engine().kill(victim["Id"])  # docker kill, as a node or an operator would
        # the task's own tests run in a fresh sandbox of its image: that one is lost while grading
        grader_box = await waiting_at(
            backend, ids["grading"], GRADING_GATE, owner_pid=owner, sessions=VERIFIER_SESSIONS
        )
        engine().remove_container(grader_box["Id"], force=True)  # docker rm -f while grading
        results = {
            k: await h.wait_for_completion() for k, h in (("killed", killed), ("self", self_kill), ("grading", grading))
        }

    lost = results["killed"]
    assert lost.status is RolloutStatus.FAILURE
    assert lost.err_category is RolloutErrorCategory.INTERNAL_ERROR, lost.err_message
    victim_name = victim["Labels"][L.SANDBOX]
    # gone, or still being removed ("removing") when the trial looked: either way not running
    assert lost.err_message.startswith(f"sandbox {victim_name} was lost (container "), lost.err_message
    assert "by the infrastructure" in lost.err_message and lost.err_message.endswith("during the agent phase")
    extra = diagnostics(osmosis_home, ids["killed"])
    assert extra["failed_phase"] == "agent" and extra["attempts"] == 1 and "lost_sandboxes" not in extra

    own = results["self"]  # exit 137 from a sandbox that still runs: the workflow's own failure
    assert own.status is RolloutStatus.FAILURE
    assert own.err_category is RolloutErrorCategory.AGENT_ERROR, own.err_message
    assert "status 137" in own.err_message

    graded = results["grading"]
    assert graded.status is RolloutStatus.FAILURE
    assert graded.err_category is RolloutErrorCategory.INTERNAL_ERROR, graded.err_message
    assert graded.err_message.endswith("during the verifier phase") and "was lost" in graded.err_message
    assert diagnostics(osmosis_home, ids["grading"])["failed_phase"] == "verifier"
    assert managed_containers(owner_pid=os.getpid()) == []
    assert sandbox_sdk.sandboxes_left() == []


async def test_infra_retries_run_the_rollout_again_on_a_fresh_sandbox(tmp_path, tasks, fake_chat, osmosis_home):
    backend = make_backend(tmp_path, tasks, infra_retries=1)
    rollout_id = f"retried-{uuid.uuid4().hex[:6]}"
    async with serve(backend) as url, client_for(url) as client:
        handle = await start(client, fake_chat, rollout_id, BLOCKING_REPLY)
        first = await waiting_at(backend, rollout_id, AGENT_GATE)
        engine().remove_container(first["Id"], force=True)  # docker rm -f during the agent phase
        second = await waiting_at(backend, rollout_id, AGENT_GATE, not_in={first["Id"]})
        assert second["Labels"][L.SANDBOX] != first["Labels"][L.SANDBOX]  # a fresh sandbox, not the lost one
        assert in_sandbox(second["Id"], "sh", "-c", f"echo go > {AGENT_GATE}") == 0
        result = await handle.wait_for_completion()
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.reward == 1.0
    extra = diagnostics(osmosis_home, rollout_id)
    assert extra["attempts"] == 2
    (lost,) = extra["lost_sandboxes"]
    assert lost["error"].startswith(f"sandbox {first['Labels'][L.SANDBOX]} was lost")
    assert lost["trial_name"] != extra["trial_name"]
    assert not (tmp_path / "trials" / lost["trial_name"]).exists()  # the lost attempt left no trial dir
    assert gone(first["Id"]) and managed_containers(owner_pid=os.getpid()) == []


@pytest.mark.skipif(not HARBOR.error_policies, reason="Harbor 0.25 has no error policies to override")
async def test_an_override_saying_a_loss_is_not_retried_stops_infra_retries(tmp_path, tasks, fake_chat, osmosis_home):
    """Harbor 0.26's ``override_error_policy`` governs our retries too: the same loss as above
    (there retried on a fresh sandbox) ends the rollout when the user says it is not retried."""
    backend = make_backend(
        tmp_path, tasks, infra_retries=1, override_error_policy={"AgentSandboxLostError": {"should_retry": False}}
    )
    rollout_id = f"not-retried-{uuid.uuid4().hex[:6]}"
    async with serve(backend) as url, client_for(url) as client:
        handle = await start(client, fake_chat, rollout_id, BLOCKING_REPLY)
        first = await waiting_at(backend, rollout_id, AGENT_GATE)
        engine().remove_container(first["Id"], force=True)
        result = await handle.wait_for_completion()
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR, result.err_message
    assert result.err_message.startswith(f"sandbox {first['Labels'][L.SANDBOX]} was lost")
    extra = diagnostics(osmosis_home, rollout_id)
    assert extra["attempts"] == 1 and "lost_sandboxes" not in extra
    assert managed_containers(owner_pid=os.getpid()) == []


def test_override_error_policy_is_checked_against_the_installed_harbor(tmp_path, tasks) -> None:
    if not HARBOR.error_policies:
        with pytest.raises(
            ConfigError, match=r"override_error_policy needs Harbor 0.26 or newer \(installed: Harbor 0.25\)"
        ):
            make_backend(tmp_path, tasks, override_error_policy={"AgentSandboxLostError": {"should_retry": False}})
        return
    with pytest.raises(ConfigError, match=r"override_error_policy\['AgentSandboxLostError'\]: .*should_retry, should"):
        make_backend(tmp_path, tasks, override_error_policy={"AgentSandboxLostError": {"retry": False}})
    with pytest.raises(ConfigError, match="'no such type' is not an exception type name"):
        make_backend(tmp_path, tasks, override_error_policy={"no such type": {"should_retry": False}})


def test_infra_retries_must_be_a_count(tmp_path, tasks) -> None:
    with pytest.raises(ValueError, match="infra_retries"):
        make_backend(tmp_path, tasks, infra_retries=-1)
