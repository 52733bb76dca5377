"""docs/operations.md ("Lost sandboxes"): a workflow OOM-killed inside the task's memory limit is the
workflow's ``agent_error``, not a lost sandbox (``internal_error``): the sandbox still runs.

The task is the bundled template with ``[environment] memory_mb = 256``; the workflow fills
memory in its own process until the kernel kills it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from harbor.models.task.config import TaskConfig
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from tests.support.common import FIXTURES, TASKS, managed_containers
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


async def test_an_oom_kill_inside_the_limit_is_an_agent_error(tmp_path: Path, bundles_dir: Path, fake_chat) -> None:
    task = shutil.copytree(TASKS / "template", tmp_path / "small-template")
    config = TaskConfig.model_validate_toml((task / "task.toml").read_text())
    config.environment.memory_mb = 256
    (task / "task.toml").write_text(config.model_dump_toml())
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=task,
        task_mode="template",
        agent="rollout_fixtures.workflows:MemoryHogWorkflow",
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
    )
    async with serve(backend) as url, client_for(url) as client:
        result = await client.run_rollout(
            initial_messages=[{"role": "user", "content": "use all the memory"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=f"oom-{uuid.uuid4().hex[:6]}",
            llm_api_key="sk-oom-test",
        )
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR, result.err_message
    assert "137" in (result.err_message or ""), result.err_message  # SIGKILL, from the memory limit
    assert "lost" not in (result.err_message or "")
    assert not managed_containers(owner_pid=os.getpid())
