"""A sandbox lost in the ``environment`` and ``agent_setup`` phases (docs/operations.md, "Lost sandboxes";
the agent and verifier phases are in ``tests/e2e/lost_sandbox/test_lost_in_agent_or_verifier.py``): ``internal_error`` naming
the sandbox and the phase, through the real server. Beside them, a third rollout on the same
backend shows ``patch_dockerfile_with_sdk=False`` itself works (README, "Rollouts"): the image is
built as the task wrote it and the wheel is pip-installed at setup.

The image is not patched (``patch_dockerfile_with_sdk=False``), so the environment phase runs
Harbor's own preparation commands and agent setup pip-installs the wheel: both phases make
sandbox calls. The test plays the infrastructure: it kills the first sandbox as soon as the
SDK created it (environment phase), or as soon as ``pip install`` is launched in it (agent setup).

The task's own Dockerfile makes the bundle's venv with its dependencies, as a task author who
preinstalls them writes it (the same layer a patched image builds, so Docker's cache has it):
pip at setup then installs the wheel without an index, in seconds instead of twice a download.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker.sandbox import DockerSandbox
from osmosis_harbor.sandbox.sdk.calls import Dual
from osmosis_harbor.tasks.dockerfile import EnvironmentPatch, patch_environment
from osmosis_harbor.tasks.refs import ResolvedTask
from tests.support.common import managed_containers
from tests.support.lost_sandbox import engine, make_backend, start
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


def _kill_when_created(monkeypatch: pytest.MonkeyPatch, marker: str) -> list[str]:
    """Wrap the SDK's create: a sandbox whose name holds ``marker`` is killed before create
    returns it to Harbor (the node died right after scheduling it)."""
    real = docker_sdk.create
    killed: list[str] = []

    def create_then_kill(*args: Any, **kwargs: Any) -> Any:
        sandbox = real._fn(*args, **kwargs)
        if marker in str(kwargs.get("name")) and not killed:
            engine().kill(sandbox.id)
            killed.append(str(kwargs.get("name")))
        return sandbox

    monkeypatch.setattr(docker_sdk, "create", Dual(create_then_kill, on_abandon=real._on_abandon))
    return killed


def _kill_once_pip_installs(monkeypatch: pytest.MonkeyPatch, marker: str) -> list[dict[str, Any]]:
    """Wrap the SDK's exec launch: once ``pip install`` runs in a sandbox whose name holds
    ``marker``, its container is killed (the node died during agent setup)."""
    real = DockerSandbox.launch
    killed: list[dict[str, Any]] = []

    def launch_then_kill(self: DockerSandbox, argv, *args: Any) -> Any:
        run = real(self, argv, *args)
        if marker in self.name and "pip install" in " ".join(argv) and not killed:
            killed.append(engine().inspect_container(self.id)["Config"])
            engine().kill(self.id)
        return run

    monkeypatch.setattr(DockerSandbox, "launch", launch_then_kill)
    return killed


async def test_lost_in_the_environment_and_agent_setup_phases(
    tmp_path: Path,
    tasks: Path,  # noqa: F811 (the fixture imported above)
    fake_chat,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = make_backend(tmp_path, tasks, patch_dockerfile_with_sdk=False)
    assert backend.bundle is not None
    patch_environment(
        tasks / "graded" / "environment", EnvironmentPatch(requirements=list(backend.bundle.dependencies))
    )
    env_id, setup_id = f"envlost-{uuid.uuid4().hex[:6]}", f"setuplost-{uuid.uuid4().hex[:6]}"
    killed = _kill_when_created(monkeypatch, "envlost")
    victims = _kill_once_pip_installs(monkeypatch, "setuplost")
    async with serve(backend) as url, client_for(url) as client:
        in_environment = await start(client, fake_chat, env_id, "reply: echo 42 > answer.txt")
        in_setup = await start(client, fake_chat, setup_id, "reply: echo 42 > answer.txt")
        # unpatched, the grader's own fresh sandbox pip-installs the bundle inside the
        # verifier's timeout (the task's is 60 s): give it room on a loaded machine
        untouched = await start(
            client,
            fake_chat,
            f"unpatched-{uuid.uuid4().hex[:6]}",
            "reply: echo 42 > answer.txt",
            grader_timeout_sec=600,
        )
        env_result = await in_environment.wait_for_completion()
        setup_result = await in_setup.wait_for_completion()
        unpatched = await untouched.wait_for_completion()

    assert len(killed) == 1
    assert env_result.status is RolloutStatus.FAILURE
    assert env_result.err_category is RolloutErrorCategory.INTERNAL_ERROR, env_result.err_message
    assert f"sandbox {killed[0]} was lost" in env_result.err_message, env_result.err_message
    assert env_result.err_message.endswith("during the environment phase"), env_result.err_message

    assert setup_result.status is RolloutStatus.FAILURE
    assert setup_result.err_category is RolloutErrorCategory.INTERNAL_ERROR, setup_result.err_message
    (victim,) = victims
    assert f"sandbox {victim['Labels'][L.SANDBOX]} was lost" in setup_result.err_message
    assert setup_result.err_message.endswith("during the agent_setup phase"), setup_result.err_message
    # patch_dockerfile_with_sdk=False: the copy's Dockerfile is the task's own, and the rollout
    # still ran its workflow (so the wheel was installed at setup) and was graded
    copy = backend.materialize(
        ResolvedTask(task_id="t", path=tasks / "graded", source="template"), tmp_path / "copy", request=None
    )
    assert not copy.environment_patched and copy.bundle_baked is None
    assert (copy.path / "environment" / "Dockerfile").read_text() == (
        tasks / "graded" / "environment" / "Dockerfile"
    ).read_text()
    assert unpatched.status is RolloutStatus.SUCCESS, unpatched.err_message
    assert unpatched.sample.reward == 1.0
    assert managed_containers(owner_pid=os.getpid()) == []
