"""The bundle baked into the task image: a trial's agent setup makes no exec, the grader runs
without pip in its fresh verifier sandbox, an image baking another bundle fails with one clear
line, and an image built elsewhere (no Dockerfile to patch) still gets the pip install.

Real osmosis server, real Harbor TrialQueue, real Docker sandboxes. The sandbox calls are
recorded by wrapping ``SandboxEnvironment`` in place, the phase by wrapping the agent's setup.
"""

from __future__ import annotations

import contextvars
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harbor.models.trial.config import AgentConfig
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.agents.workflow import WorkflowAgent
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.backend.plan import Planner
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment
from osmosis_harbor.shim import contract
from tests.support.common import FIXTURES, graded_template
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

ANSWER = "Write 42 to answer.txt\nreply: echo 42 > answer.txt"


@dataclass
class Calls:
    """Sandbox calls made through the environment, with the phase they were made in."""

    records: list[tuple[str | None, str, str]] = field(default_factory=list)
    tests_uploads: list[dict[str, bytes]] = field(default_factory=list)  # what the verifier got in /tests

    def during_setup(self) -> list[tuple[str, str]]:
        return [(kind, what) for phase, kind, what in self.records if phase == "agent_setup"]

    def execs(self) -> list[str]:
        return [what for _, kind, what in self.records if kind == "exec"]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    phase: contextvars.ContextVar[str | None] = contextvars.ContextVar("phase", default=None)
    recorded = Calls()
    setup, exec_, upload_file, upload_dir = (
        WorkflowAgent.setup,
        SandboxEnvironment.exec,
        SandboxEnvironment.upload_file,
        SandboxEnvironment.upload_dir,
    )

    async def traced_setup(self, environment):
        token = phase.set("agent_setup")
        try:
            return await setup(self, environment)
        finally:
            phase.reset(token)

    async def traced_exec(self, command, *args, **kwargs):
        recorded.records.append((phase.get(), "exec", command))
        return await exec_(self, command, *args, **kwargs)

    async def traced_upload_file(self, source_path, target_path):
        recorded.records.append((phase.get(), "upload_file", target_path))
        return await upload_file(self, source_path, target_path)

    async def traced_upload_dir(self, source_dir, target_dir):
        recorded.records.append((phase.get(), "upload_dir", target_dir))
        if target_dir == "/tests":
            files = {p.name: p.read_bytes() for p in Path(source_dir).rglob("*") if p.is_file()}
            recorded.tests_uploads.append(files)
        return await upload_dir(self, source_dir, target_dir)

    monkeypatch.setattr(WorkflowAgent, "setup", traced_setup)
    monkeypatch.setattr(SandboxEnvironment, "exec", traced_exec)
    monkeypatch.setattr(SandboxEnvironment, "upload_file", traced_upload_file)
    monkeypatch.setattr(SandboxEnvironment, "upload_dir", traced_upload_dir)
    return recorded


def backend(tmp_path: Path, bundles_dir: Path, tasks_dir: Path) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=2),
        tasks_dir=tasks_dir,
        task_mode="template",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader="rollout_fixtures.graders:AnswerGrader",
        grader_config="rollout_fixtures.graders:fixture_grader_config",
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
    )


async def rollout(target: HarborBackend, fake_chat, text: str = ANSWER, *, grade: bool = True):
    async with serve(target) as url, client_for(url) as client:
        return await rollout_via(client, fake_chat, text, grade=grade)


async def rollout_via(client, fake_chat, text: str = ANSWER, *, grade: bool = True):
    return await client.run_rollout(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=fake_chat.base_url,
        rollout_id=f"baked-{uuid.uuid4().hex[:8]}",
        llm_api_key="sk-baked-test",
        label="42",
        grade=grade,
    )


async def test_sandbox_call_budget_of_trivial_and_graded_rollouts(
    tmp_path: Path, bundles_dir: Path, fake_chat, sdk_calls: Counter[str]
) -> None:
    """Each SDK call is a round trip to the SkyPilot API server. By default every SDK moves files
    as SkyPilot's path does (``routes.py``): a trivial rollout is create, the workflow's exec (the
    input rides it, the /logs pack rides back in its output), terminate. A graded one adds a fresh
    verifier sandbox: create, one file write (the artifacts and tests, Harbor's emptying of the
    workdir staged with them), test.sh's exec (the unpack before it, the /logs pack after it),
    terminate."""
    async with serve(backend(tmp_path, bundles_dir, graded_template(tmp_path))) as url, client_for(url) as client:
        result = await rollout_via(client, fake_chat, grade=False)
        assert result.status is RolloutStatus.SUCCESS, result.err_message
        assert dict(sdk_calls) == {"create": 1, "exec": 1, "terminate": 1}
        sdk_calls.clear()
        result = await rollout_via(client, fake_chat)
        assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message
        assert dict(sdk_calls) == {"create": 2, "exec": 2, "write_bytes": 1, "terminate": 2}


async def test_an_input_too_large_to_ride_the_exec_goes_as_a_file(
    tmp_path: Path, bundles_dir: Path, fake_chat, calls: Calls
) -> None:
    padding = "x" * (contract.INLINE_INPUT_MAX_BYTES + 1)
    result = await rollout(backend(tmp_path, bundles_dir, graded_template(tmp_path)), fake_chat, f"{padding}\n{ANSWER}")
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.reward == 1.0
    assert calls.during_setup() == [("upload_file", contract.ROLLOUT_INPUT)]
    assert result.sample.messages[0]["content"].startswith(padding)  # the workflow read the whole file


async def test_a_baked_rollout_sets_up_without_exec_and_grades_without_pip(
    tmp_path: Path, bundles_dir: Path, fake_chat, calls: Calls
) -> None:
    result = await rollout(backend(tmp_path, bundles_dir, graded_template(tmp_path)), fake_chat)
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.reward == 1.0 and result.sample.metrics.get("answer_found") == 1.0
    # agent setup: nothing at all (the input rides the workflow's exec), nothing executed
    assert calls.during_setup() == []
    assert not any(target == contract.ROLLOUT_INPUT for _, kind, target in calls.records if kind == "upload_file")
    workflow = [c for c in calls.execs() if "-agent" in c]
    assert len(workflow) == 1 and contract.BUNDLE_MARKER in workflow[0]  # checked in the workflow's own exec
    assert not any("pip" in c for c in calls.execs())
    # the verifier's /tests: no wheel, and a launcher that checks the marker instead of installing
    (tests,) = calls.tests_uploads
    assert not any(name.endswith(".whl") for name in tests)
    assert b"pip" not in tests["osmosis_grade.sh"] and contract.BUNDLE_MARKER.encode() in tests["osmosis_grade.sh"]


async def test_an_image_baking_another_bundle_fails_with_one_clear_line(
    tmp_path: Path, bundles_dir: Path, fake_chat, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image bakes this backend's bundle; the agent is told to expect another one (as when a
    pool or an image of another bundle is claimed). Ungraded: the workflow's own exec fails, and a
    verifier's head-started sandbox would wait for nothing."""
    workflow_config = Planner._workflow_config

    def expecting_another(self, *args, **kwargs) -> AgentConfig:
        config = workflow_config(self, *args, **kwargs)
        return config.model_copy(update={"kwargs": {**config.kwargs, "bundle_baked": "another-bundle"}})

    monkeypatch.setattr(Planner, "_workflow_config", expecting_another)
    target = backend(tmp_path, bundles_dir, graded_template(tmp_path))
    result = await rollout(target, fake_chat, grade=False)
    assert result.status is RolloutStatus.FAILURE
    message = result.err_message or ""
    assert contract.WRONG_BUNDLE_MESSAGE in message and "re-run prewarm" in message, message
    assert "runs bundle another-bundle" in message and f"holds {target.bundle.key}" in message, message


async def test_an_image_only_task_still_installs_the_bundle_with_pip(
    tmp_path: Path, bundles_dir: Path, fake_chat, calls: Calls
) -> None:
    # an image built elsewhere: here, the one prewarm builds for the template (python, and the
    # bundle's dependencies in the venv, so pip needs no index), named by docker_image
    report = await backend(tmp_path / "prewarm", bundles_dir, graded_template(tmp_path)).prewarm()
    image = report.groups_detail[0].image
    assert image and report.failed == 0
    task = graded_template(tmp_path, "image-only")
    (task / "environment" / "Dockerfile").unlink()
    toml = (task / "task.toml").read_text().replace("[environment]\n", f'[environment]\ndocker_image = "{image}"\n')
    (task / "task.toml").write_text(toml)
    calls.records.clear()
    calls.tests_uploads.clear()
    result = await rollout(backend(tmp_path, bundles_dir, task), fake_chat)
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.reward == 1.0
    setup_execs = [what for kind, what in calls.during_setup() if kind == "exec"]
    assert any("pip install" in c and "--no-deps" not in c for c in setup_execs), setup_execs
    assert not any(contract.BUNDLE_MARKER in c for c in calls.execs())  # nothing baked: no marker to check
    (tests,) = calls.tests_uploads
    assert any(name.endswith(".whl") for name in tests) and b"pip install" in tests["osmosis_grade.sh"]


async def test_trees_move_over_the_sdks_own_calls_in_fewer_calls_than_harbors_path(
    tmp_path: Path, bundles_dir: Path, fake_chat, sdk_calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SkyPilot's SDK offers no archive calls. A tree still moves as one archive, made of its own calls
    (``exec_archives.py``): an upload is a file write plus the unpack command, which also empties
    its targets as Harbor asked; a fetch the pack command plus a file read, the agent's /logs and
    its workdir (a declared artifact) in one. So the graded rollout costs: the workflow's exec,
    one fetch of the agent's trees; in the verifier's sandbox one upload, test.sh, one fetch of
    /logs. With ``OSMOSIS_HARBOR_EXEC_ARCHIVES=0`` the same rollout takes Harbor's own write/read
    + tar path, at more calls, and still skips what a fresh baked sandbox makes redundant."""
    async with serve(backend(tmp_path, bundles_dir, graded_template(tmp_path))) as url, client_for(url) as client:
        result = await rollout_via(client, fake_chat)
        assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message
        over_commands = dict(sdk_calls)
        # Folded (exec_folds.py): /logs packs ride the workflow's exec and test.sh's (small: in
        # their output, no read), the verifier's upload unpacks inside test.sh's exec.
        assert over_commands == {"create": 2, "exec": 2, "write_bytes": 1, "terminate": 2}
        sdk_calls.clear()
        monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
        result = await rollout_via(client, fake_chat)
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message
    assert sdk_calls["put_archive"] == sdk_calls["get_archive"] == 0
    assert sdk_calls["write_bytes"] > 0 and sdk_calls["read_bytes"] > 0
    assert sum(sdk_calls.values()) > sum(over_commands.values()), (dict(sdk_calls), over_commands)
