"""What the lost-sandbox tests (``tests/e2e/lost_sandbox``) and the hostile-files tests share: a
backend on the rollout fixture project, the rollout's running sandbox found by its labels, gates
a workflow or a task's tests wait at, and the outcome's diagnostics as the osmosis server saved them."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import docker
import docker.errors
from harbor.environments.skypilot import _sanitize_dns_name
from harbor.trial.queue import TrialQueue

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, managed_containers, wait_until
from tests.support.sdk_paths import DOCKER, SdkPath

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
