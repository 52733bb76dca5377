"""A workflow that runs as root in its sandbox cannot write its own reward.

Each rollout answers wrong (``7`` for the label ``42``) and then attacks the grader's path
the way a reward-hacking policy would: rewriting the installed grader, replacing the grade
script, leaving a detached process that keeps rewriting ``/logs/verifier/reward.json``
(also while the grader itself fails), planting modules where a careless grader run would
import them, writing the reward file up front. Through the real osmosis server and real
Docker sandboxes, the reward must stay the grader's verdict on the wrong answer: 0.

Positive control: every attack also runs with the verifier *not* isolated (the grader in
the agent's own sandbox, Harbor's ``shared`` mode). The backend has no option for that (a
grader always verifies in a sandbox of its own), so the control switches the one internal
decision, ``prepare_task(isolate_grader=...)`` as the rollout plan calls it, for the
rollouts whose id starts with ``shared-``. An attack that forges 1.0 there and not under
isolation is stopped by the isolation; an attack that forges nothing even there is shown
to have been really attempted by what it left in the agent's sandbox.

One backend serves every rollout of the Docker path: its grader, the fixture project's
``FailingGrader``, is ``AnswerGrader`` but for the label ``raise``, where it fails as
``RaisingGrader`` does (the failing-grader rollouts).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutResultResponse, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.backend import plan as plan_module
from osmosis_harbor.sandbox.owner.head_start import HeadStart
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, graded_template, managed_containers
from tests.support.emulator import EmulatorServer
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER, EMULATOR, SdkPath

pytestmark = pytest.mark.slow

PROJECT = FIXTURES / "rollout_project"
RAISE = "raise"  # FailingGrader's label for failing as RaisingGrader
ATTACKS = ["rewrite-grader", "replace-grade-script", "reward-rewriter", "shadow-modules", "reward-file-up-front"]
EMULATOR_ATTACKS = ["rewrite-grader", "reward-rewriter", "shadow-modules"]  # one of each kind
SHARED = "shared-"  # rollout ids with this prefix verify in the agent's sandbox (the control)


def _backend(root: Path, tasks_dir: Path, grader: str, sdk: SdkPath = DOCKER) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=tasks_dir,
        task_mode="template",
        agent="rollout_fixtures.workflows:HostileWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader=f"rollout_fixtures.graders:{grader}",
        grader_config="rollout_fixtures.graders:fixture_grader_config",
        code_dir=PROJECT,
        bundles_dir=None,  # the session's cache ($OSMOSIS_HARBOR_BUNDLES, tests/conftest.py)
        environment_config=sdk.environment(),
        trials_dir=root / "trials",
        cleanup_successful_trials=False,
    )


_ISOLATE: contextvars.ContextVar[bool] = contextvars.ContextVar("isolate_grader", default=True)


def _isolation_switch(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, bool]], list[str]]:
    """Turn the verifier's isolation off for ``shared-`` rollouts; record every decision. Their
    copies are made afresh, never linked from the copy the isolated rollouts share
    (``tasks/prepared.py``), which is left as the rollout plan makes it. Their verifier has no
    sandbox of its own, so none is head-started for them (it would be terminated untaken): the
    sessions whose head start was skipped are the second list."""
    real_materialize = plan_module.Planner.materialize
    real_prepare = plan_module.prepare_task
    real_link = plan_module.PreparedCopies.link
    real_begin = HeadStart.begin
    decisions: list[tuple[str, bool]] = []
    skipped: list[str] = []

    def materialize(self: Any, plan: Any, dest: Path, request: Any) -> Any:
        rollout_id = request.id if request is not None else ""
        isolate = not rollout_id.startswith(SHARED)
        decisions.append((rollout_id, isolate))
        token = _ISOLATE.set(isolate)
        try:
            return real_materialize(self, plan, dest, request)
        finally:
            _ISOLATE.reset(token)

    def prepare(*args: Any, **kwargs: Any) -> Any:
        kwargs["isolate_grader"] = kwargs.get("isolate_grader", False) and _ISOLATE.get()
        return real_prepare(*args, **kwargs)

    def link(self: Any, key: Any, source: Path, prepare: Any, dest: Path) -> Any:
        return real_link(self, key, source, prepare, dest) if _ISOLATE.get() else prepare(dest)

    def begin(self: Any, agent_session: str, *args: Any) -> None:
        if SHARED in agent_session:  # the session is named after the rollout id
            skipped.append(agent_session)
        else:
            real_begin(self, agent_session, *args)

    monkeypatch.setattr(plan_module.Planner, "materialize", materialize)
    monkeypatch.setattr(HeadStart, "begin", begin)
    monkeypatch.setattr(plan_module, "prepare_task", prepare)
    monkeypatch.setattr(plan_module.PreparedCopies, "link", link)
    return decisions, skipped


async def _attack(
    client: Any, chat: FakeChatServer, attack: str, prefix: str = "", label: str = "42"
) -> RolloutResultResponse:
    return await client.run_rollout(
        initial_messages=[{"role": "user", "content": f"Compute 6*7. attack: {attack}"}],
        chat_completions_url=chat.base_url,
        rollout_id=f"{prefix}hostile-{attack}-{uuid.uuid4().hex[:6]}",
        llm_api_key="sk-hostile",
        label=label,
    )


class Runs:
    """Every attack's result, isolated and shared, and the failing grader's, from one server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.isolated: dict[str, RolloutResultResponse] = {}
        self.shared: dict[str, RolloutResultResponse] = {}
        self.raising: dict[str, RolloutResultResponse] = {}  # RaisingGrader: "isolated"/"shared" x attack
        self.decisions: list[tuple[str, bool]] = []
        self.no_head_start: list[str] = []  # the shared rollouts' sessions, whose verifier has no sandbox

    def trial_dir(self, result: RolloutResultResponse) -> Path:
        """The retained trial of a rollout (its config names the rollout id)."""
        found = [
            d
            for d in (self.root / "trials").iterdir()
            if (d / "config.json").is_file()
            and json.loads((d / "config.json").read_text())["agent"]["kwargs"]["rollout_id"] == result.rollout_id
        ]
        assert len(found) == 1, (result.rollout_id, found)
        return found[0]


RAISING = [("isolated", "reward-rewriter"), ("shared", "reward-rewriter"), ("shared", "reward-file-up-front")]


async def _serve_attacks(
    backend: HarborBackend, chat: FakeChatServer, attacks: list[tuple[str, str]]
) -> list[RolloutResultResponse]:
    """Each ``(mode, attack)`` at once; a mode ending ``@raise`` sends the label ``raise``."""
    async with serve(backend) as url, client_for(url) as client:
        return list(
            await asyncio.gather(
                *(
                    _attack(
                        client,
                        chat,
                        attack,
                        SHARED if mode.startswith("shared") else "",
                        RAISE if mode.endswith(f"@{RAISE}") else "42",
                    )
                    for mode, attack in attacks
                )
            )
        )


@pytest.fixture(scope="module")
async def runs(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Runs]:
    root = tmp_path_factory.mktemp("reward-integrity")
    (root / "home").mkdir()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("HOME", str(root / "home"))
        out = Runs(root)
        out.decisions, out.no_head_start = _isolation_switch(monkeypatch)
        task = graded_template(root)
        answered = [("isolated", a) for a in ATTACKS] + [("shared", a) for a in ATTACKS]
        raising = [(f"{mode}@{RAISE}", attack) for mode, attack in RAISING]
        chat = FakeChatServer()
        try:
            results = await _serve_attacks(_backend(root, task, "FailingGrader"), chat, answered + raising)
        finally:
            chat.close()
        first, second = results[: len(answered)], results[len(answered) :]
        out.isolated = dict(zip(ATTACKS, first[: len(ATTACKS)], strict=True))
        out.shared = dict(zip(ATTACKS, first[len(ATTACKS) :], strict=True))
        out.raising = {f"{mode} {attack}": result for (mode, attack), result in zip(RAISING, second, strict=True)}
        yield out
    assert not managed_containers(owner_pid=os.getpid()), "sandboxes left behind"


def test_the_switch_really_switches(runs: Runs) -> None:
    decided = dict(runs.decisions)
    assert len(decided) == 2 * len(ATTACKS) + len(RAISING)
    assert all(isolated is not rid.startswith(SHARED) for rid, isolated in decided.items()), decided
    shared = [rid for rid, isolated in decided.items() if not isolated]
    assert len(runs.no_head_start) == len(shared), (runs.no_head_start, shared)


@pytest.mark.parametrize("attack", ATTACKS)
def test_isolation_keeps_the_graders_verdict(runs: Runs, attack: str) -> None:
    result = runs.isolated[attack]
    assert result.status is RolloutStatus.SUCCESS, (attack, result.err_message)
    assert result.sample is not None
    assert result.sample.reward == 0.0, f"{attack}: the workflow forged reward {result.sample.reward}"
    assert result.sample.metrics.get("answer_found") == 1.0  # the real grader ran, on "7"
    assert result.sample.metrics.get("attack") == 1.0  # the workflow reached its attack and returned


@pytest.mark.parametrize("attack", ["rewrite-grader", "replace-grade-script", "reward-rewriter"])
def test_without_isolation_the_attack_forges_the_reward(runs: Runs, attack: str) -> None:
    """Positive control: what the isolation stops does forge 1.0 in the agent's own sandbox."""
    result = runs.shared[attack]
    assert result.status is RolloutStatus.SUCCESS, (attack, result.err_message)
    assert result.sample is not None and result.sample.reward == 1.0


def test_planted_modules_reach_the_grader_but_are_never_imported(runs: Runs, tmp_path: Path) -> None:
    """Isolation does not stop this one: the agent's workdir is carried to the grader's sandbox
    by design (it holds the answer). What stops it is how the grader starts (a console script:
    its directory, not the working directory, is on ``sys.path``), in either mode."""
    assert runs.isolated["shadow-modules"].sample.reward == 0.0  # type: ignore[union-attr]
    assert runs.shared["shadow-modules"].sample.reward == 0.0  # type: ignore[union-attr]
    # Positive control: the planted package is among what the grader's sandbox received, and a
    # Python that puts its working directory on sys.path (``python -c``) imports the forgery. The
    # planted start-up hook is not: the host drops it from the carried workdir (``tasks/carried.py``).
    carried = runs.trial_dir(runs.isolated["shadow-modules"]) / "artifacts" / "workspace"
    assert not (carried / "sitecustomize.py").exists()
    probe = shutil.copytree(carried / "rollout_fixtures", tmp_path / "probe" / "rollout_fixtures")
    code = "import inspect, rollout_fixtures.graders as g; print(inspect.getsource(g.AnswerGrader.grade))"
    done = subprocess.run([sys.executable, "-c", code], cwd=probe.parent, capture_output=True, text=True, check=True)
    assert "ctx.set_reward(1.0)" in done.stdout and "answer" not in done.stdout


def test_a_reward_file_up_front_is_overwritten_by_the_grader(runs: Runs) -> None:
    """Isolation does not stop this one either: Harbor empties ``/logs/verifier`` before its
    verifier runs, and a grader that ran writes its own reward.json, in either mode (with a
    grader that writes none, the planted file is gone too: see the failing-grader test)."""
    for result in (runs.isolated["reward-file-up-front"], runs.shared["reward-file-up-front"]):
        assert result.status is RolloutStatus.SUCCESS and result.sample is not None
        assert result.sample.reward == 0.0 and result.sample.metrics.get("answer_found") == 1.0


@pytest.mark.parametrize("mode_attack", [f"{mode} {attack}" for mode, attack in RAISING])
def test_a_failing_grader_is_a_failure_whatever_the_workflow_writes(runs: Runs, mode_attack: str) -> None:
    result = runs.raising[mode_attack]
    assert result.status is RolloutStatus.FAILURE, f"forged success, reward {result.sample and result.sample.reward}"
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR  # a ValueError, as LocalBackend says
    assert "the grader broke on purpose" in (result.err_message or "")
    reward_file = runs.trial_dir(result) / "verifier" / "reward.json"
    if mode_attack == "shared reward-rewriter":  # positive control: Harbor did read a forged reward
        assert json.loads(reward_file.read_text()) == {"reward": 1.0}
    if mode_attack == "shared reward-file-up-front":  # Harbor empties /logs/verifier before test.sh
        assert not reward_file.exists()


def test_the_grader_runs_in_a_sandbox_of_its_own(tmp_path: Path) -> None:
    """What the materialized copy tells Harbor: separate verifier, the agent's products as data."""
    from harbor.models.task.config import TaskConfig, VerifierEnvironmentMode

    from osmosis_harbor.tasks.refs import ResolvedTask

    template = graded_template(tmp_path)
    backend = _backend(tmp_path, template, "AnswerGrader")
    copy = backend.materialize(
        ResolvedTask(task_id="t", path=template, source="template"), tmp_path / "copy", request=None
    ).path
    config = TaskConfig.model_validate_toml((copy / "task.toml").read_text())
    assert config.verifier.environment_mode is VerifierEnvironmentMode.SEPARATE
    assert config.artifacts == ["/logs/agent", "/workspace"]
    # the image bakes the bundle in: the fresh verifier sandbox checks its marker, installs nothing
    assert "/opt/osmosis/bundle.id" in (copy / "tests" / "osmosis_grade.sh").read_text()
    assert not list((copy / "tests").glob("*.whl"))


async def test_on_the_emulator_a_root_workflow_cannot_forge_its_reward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator_server: EmulatorServer
) -> None:
    """The isolated attacks again on SkyPilot's path (the skypilot-emulator: no archives, task
    images by registry reference, Harbor's own transfers carry the grader's files): the reward
    stays the grader's verdict. One attack of each kind: a grader file changed in the agent's
    sandbox (``replace-grade-script`` is the same kind), a process left writing the reward, modules
    planted in the workdir the transfers carry; ``reward-file-up-front`` (a file in the agent's
    own ``/logs/verifier``, which a separate verifier never sees) runs on docker only. The Docker
    path, and the shared-mode positive controls that show each attack works where it is not
    stopped, are the module's ``runs`` above."""
    sdk = SdkPath(EMULATOR, emulator_server)
    monkeypatch.setenv("HOME", str(tmp_path))
    routes = sdk.routes()
    chat = FakeChatServer()
    try:
        backend = _backend(tmp_path, graded_template(tmp_path), "AnswerGrader", sdk)
        results = await _serve_attacks(backend, chat, [("isolated", attack) for attack in EMULATOR_ATTACKS])
    finally:
        chat.close()
    for attack, result in zip(EMULATOR_ATTACKS, results, strict=True):
        assert result.status is RolloutStatus.SUCCESS, (attack, result.err_message)
        assert result.sample is not None and result.sample.reward == 0.0, f"{attack}: forged {result.sample}"
        assert result.sample.metrics.get("answer_found") == 1.0, attack  # the grader really ran on "7"
    sdk.assert_harbors_transfer_path(routes)
    assert sdk.sandboxes_left() == [], "emulator sandboxes left behind"
