"""What the dataset-mode attack modules (``test_verifier_guard.py``, ``test_fresh_verifier.py``)
share: a backend serving ``OutputWorkflow`` on a fixture dataset, a batch of scripted rollouts
through the real osmosis server, the SDK path of a module fixture, and its leftovers check.

Each rollout's scripted policy replies with the shell command the request names; the workflow
runs it as root in its sandbox. Where a module runs a case on the Docker path only (the same
detection logic as a case kept on both), its test carries ``DOCKER_ONLY``.
"""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutResultResponse

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, managed_containers
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import EMULATOR, SdkPath

__all__ = [
    "AUDITED",
    "DOCKER_ONLY",
    "EVERY_SDK",
    "PROJECT",
    "WRONG",
    "assert_none_left",
    "backend",
    "file",
    "rollouts",
    "sdk_of",
]

PROJECT = FIXTURES / "rollout_project"
WRONG = "echo 7 > /app/sum.txt"  # each dataset's sum-42 wants 42
EVERY_SDK = ["docker", EMULATOR]  # a module fixture's params: each key path on both SDK paths
# A test of a module fixture (``runs``) whose case runs on the Docker path only.
DOCKER_ONLY = pytest.mark.parametrize("runs", ["docker"], indirect=True)
# Set for a positive control's backend: each backend audits a dataset's environments for leaks on
# their first rollout (``backend/leak_audits.py``), and the first batch's backend has audited the
# same images already; the audit only admits or refuses a task, which the controls do not test.
AUDITED = ("OSMOSIS_HARBOR_ALLOW_LEAKING_TASKS", "1")


def file(path: str, content: bytes | str, mode: str = "644") -> str:
    """A shell command that writes ``content`` to ``path`` (atomically, with ``mode``)."""
    data = content.encode() if isinstance(content, str) else content
    return f"echo {base64.b64encode(data).decode()} | base64 -d > {path}.new && chmod {mode} {path}.new && mv {path}.new {path}"


def sdk_of(request: pytest.FixtureRequest) -> SdkPath:
    """The SDK path a module fixture parametrized by ``EVERY_SDK`` runs on."""
    if request.param == "docker":
        return SdkPath("docker")
    return SdkPath(EMULATOR, request.getfixturevalue("emulator_server"))


def backend(root: Path, sdk: SdkPath, name: str, dataset: Path) -> HarborBackend:
    """A dataset-mode backend for ``OutputWorkflow``; made under the settings of the moment."""
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=dataset,
        task_mode="dataset",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        code_dir=PROJECT,
        bundles_dir=None,  # the session's cache ($OSMOSIS_HARBOR_BUNDLES, tests/conftest.py)
        environment_config=sdk.environment(),
        trials_dir=root / f"trials-{name}",
    )


async def rollouts(served: HarborBackend, commands: dict[str, tuple[str, str]]) -> dict[str, RolloutResultResponse]:
    """One rollout per command (``name: (task, command)``), all at once through the osmosis server."""
    chat = FakeChatServer()
    try:
        async with serve(served) as url, client_for(url) as client:
            results = await asyncio.gather(
                *(
                    client.run_rollout(
                        initial_messages=[{"role": "user", "content": f"Do the task.\nreply: {command}"}],
                        chat_completions_url=chat.base_url,
                        rollout_id=f"guard-{name}-{uuid.uuid4().hex[:6]}",
                        llm_api_key="sk-guard",
                        metadata={"harbor_task_id": task},
                    )
                    for name, (task, command) in commands.items()
                )
            )
    finally:
        chat.close()
    return dict(zip(commands, results, strict=True))


def assert_none_left(sdk: SdkPath) -> None:
    if sdk.is_emulator:
        assert sdk.sandboxes_left() == [], "emulator sandboxes left behind"
    else:
        assert not managed_containers(owner_pid=os.getpid()), "sandboxes left behind"
