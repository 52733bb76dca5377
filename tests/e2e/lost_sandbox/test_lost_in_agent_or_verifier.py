"""A sandbox lost to the infrastructure is not the workflow's failure, through the real server.

The test plays the infrastructure: it finds the rollout's sandbox by its labels and kills or
removes it while the workflow (or the task's tests) wait on a FIFO in /tmp, which is also how
the test knows they are running. Opening the FIFO lets a retried attempt finish. No sleeps.
"""

from __future__ import annotations

import os
import uuid

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.errors import ConfigError
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox.docker import labels as L
from tests.support.common import managed_containers
from tests.support.lost_sandbox import (
    AGENT_GATE,
    BLOCKING_REPLY,
    GRADING_GATE,
    SELF_KILL_REPLY,
    VERIFIER_SESSIONS,
    diagnostics,
    engine,
    gone,
    in_sandbox,
    make_backend,
    start,
    waiting_at,
)
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


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
