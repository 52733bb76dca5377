"""A rollout's files where the platform looks (``<artifact root>/<rollout id>/``): the workflow's
``ctx.artifacts_dir`` as ``LocalBackend`` leaves it, Harbor's trial logs as osmosis-ai's Harbor
backend retains them, copied before the trial directory is cleaned, scrubbed of the key, bounded,
and never through a link."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.backend.local.backend import LocalBackend
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.shim.errors import REDACTED
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from osmosis_harbor.trials.export import export_rollout_files
from tests.support.common import FIXTURES, graded_template
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
KEY = "sk-export-test-" + "k" * 24


def regular_files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


async def run_all(backend, fake_chat: FakeChatServer, prompts: dict[str, str]) -> dict[str, Any]:
    """Each ``rollout id: prompt`` through the real server, at once; their results by id."""
    async with serve(backend) as url, client_for(url) as client:
        results = await asyncio.gather(
            *(
                client.run_rollout(
                    initial_messages=[{"role": "user", "content": text}],
                    chat_completions_url=fake_chat.base_url,
                    rollout_id=rollout_id,
                    llm_api_key=KEY,
                    label="42",
                )
                for rollout_id, text in prompts.items()
            )
        )
    return dict(zip(prompts, results, strict=True))


@pytest.mark.slow
@DOCKER_PATH_ONLY
async def test_rollout_files_reach_the_artifact_root_as_local_backend_leaves_them_scrubbed_of_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_chat: FakeChatServer, sandbox_sdk: SdkPath
) -> None:
    """Beside the rollout compared with the LocalBackend control, one on the same backend hoards
    its key (raw, in its artifacts and its agent logs): what reaches the root is scrubbed."""
    sandbox_sdk.require_loopback_endpoint()
    prompt = "Write 42\nreply: echo 42 > answer.txt"
    # The control: the same workflow and grader in this process, under osmosis-ai's LocalBackend.
    monkeypatch.syspath_prepend(str(PROJECT))
    from rollout_fixtures.graders import AnswerGrader, FixtureGraderConfig
    from rollout_fixtures.workflows import ArtifactsWorkflow, FixtureConfig

    work = tmp_path / "local-work"
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(tmp_path / "local-root"))
    local = LocalBackend(
        workflow=ArtifactsWorkflow,
        workflow_config=FixtureConfig(workdir=str(work)),
        grader=AnswerGrader,
        grader_config=FixtureGraderConfig(answer_file=str(work / "answer.txt")),
    )
    control = (await run_all(local, fake_chat, {"local-1": prompt}))["local-1"]
    assert control.status is RolloutStatus.SUCCESS and control.sample.reward == 1.0, control.err_message

    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(tmp_path / "harbor-root"))
    harbor = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=2),
        tasks_dir=graded_template(tmp_path),
        task_mode="template",
        agent="rollout_fixtures.workflows:ArtifactsWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader="rollout_fixtures.graders:AnswerGrader",
        grader_config="rollout_fixtures.graders:fixture_grader_config",
        code_dir=PROJECT,
        environment_config=sandbox_sdk.environment(),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=True,
    )
    results = await run_all(
        harbor, fake_chat, {"harbor-1": prompt, "hoarder": "hoard, then write 42\nreply: echo 42 > answer.txt"}
    )
    for result in results.values():
        assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message

    local_artifacts = tmp_path / "local-root" / "local-1" / "artifacts"
    ours = tmp_path / "harbor-root" / "harbor-1"
    # the same files, byte for byte, where LocalBackend keeps them; the link stayed in the sandbox
    assert regular_files(ours / "artifacts") == regular_files(local_artifacts)
    assert set(regular_files(local_artifacts)) == {"command.log", "notes/summary.md", "data.bin"}
    assert (local_artifacts / "alias.md").is_symlink() and not (ours / "artifacts" / "alias.md").exists()
    # Harbor's trial logs beside them, as osmosis-ai's Harbor backend retains them
    logs = ours / "logs"
    assert (logs / "trial.log").is_file() and (logs / "agent" / "sample.json").is_file()
    assert json.loads((logs / "verifier" / "reward.json").read_text()) == {"reward": 1.0}
    assert (ours / "trajectory.json").is_file()  # the osmosis server's own, next to them
    assert list((tmp_path / "trials").glob("*")) == []  # copied before the trial directory went
    assert sandbox_sdk.sandboxes_left() == []

    exported = tmp_path / "harbor-root" / "hoarder"
    hoard = json.loads((exported / "artifacts" / "hoard.json").read_text())
    assert hoard == {"key": REDACTED}  # the workflow wrote its key there, raw
    assert REDACTED in (exported / "logs" / "agent" / "hoard.txt").read_text()
    for path in exported.rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path


# -- the copy on its own, on a trial directory made here ----------------------------------------------------


def make_trial(trial: Path) -> None:
    convention = trial / "artifacts" / "logs" / "artifacts"
    (convention / "sub").mkdir(parents=True)
    (convention / "a.txt").write_text("a\n")
    (convention / "sub" / "b.bin").write_bytes(b"\x00\xff" * 10)
    (convention / "inside").symlink_to("a.txt")
    os.mkfifo(convention / "fifo")
    (trial / "agent").mkdir()
    (trial / "agent" / "sample.json").write_text("{}")
    (trial / "trial.log").write_text("log\n")
    (trial / "config.json").write_text("{}")  # not a log osmosis-ai retains: stays out
    step = trial / "steps" / "implement"
    (step / "artifacts" / "logs" / "artifacts").mkdir(parents=True)
    (step / "artifacts" / "logs" / "artifacts" / "a.txt").write_text("from the step\n")
    (step / "artifacts" / "logs" / "artifacts" / "step.txt").write_text("step\n")
    (step / "verifier").mkdir()
    (step / "verifier" / "reward.txt").write_text("1\n")


def test_export_layout_and_what_it_leaves_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, root = tmp_path / "trial", tmp_path / "root"
    make_trial(trial)
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(root))
    report = export_rollout_files(trial, "r-1", steps=["implement"], config=settings.current())
    assert report is not None
    assert regular_files(root / "r-1") == {
        "artifacts/a.txt": b"a\n",  # the trial's own, after the step's
        "artifacts/step.txt": b"step\n",
        "artifacts/sub/b.bin": b"\x00\xff" * 10,
        "logs/agent/sample.json": b"{}",
        "logs/trial.log": b"log\n",
        "logs/steps/implement/verifier/reward.txt": b"1\n",
    }
    assert sorted(report.skipped) == ["artifacts/logs/artifacts/fifo", "artifacts/logs/artifacts/inside"]
    assert not any(p.is_symlink() for p in (root / "r-1").rglob("*"))
    assert (
        export_rollout_files(trial, "../escape", config=settings.current()) is None
        and not (tmp_path / "escape").exists()
    )
    assert export_rollout_files(tmp_path / "no-such-trial", "r-2", config=settings.current()) is None


def test_export_never_writes_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link planted where the export writes (the rollout's directory, or one inside it) is
    replaced, never followed; positive control: a plain recursive copy writes into the canary."""
    trial, root, canary = tmp_path / "trial", tmp_path / "root", tmp_path / "canary"
    make_trial(trial)
    canary.mkdir()
    (root / "r-1").mkdir(parents=True)
    (root / "r-1" / "artifacts").symlink_to(canary, target_is_directory=True)
    (root / "r-2").symlink_to(canary, target_is_directory=True)
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(root))
    export_rollout_files(trial, "r-1", config=settings.current())
    export_rollout_files(trial, "r-2", config=settings.current())
    assert list(canary.iterdir()) == []
    assert (root / "r-1" / "artifacts" / "a.txt").read_text() == "a\n" and not (root / "r-2").is_symlink()
    (root / "naive").symlink_to(canary, target_is_directory=True)
    shutil.copytree(trial / "artifacts" / "logs" / "artifacts" / "sub", root / "naive", dirs_exist_ok=True)
    assert [p.name for p in canary.iterdir()] == ["b.bin"]  # a plain copy writes through the link


def test_export_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, root = tmp_path / "trial", tmp_path / "root"
    make_trial(trial)
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(root))
    monkeypatch.setenv("OSMOSIS_HARBOR_EXPORT_MAX_FILES", "2")
    report = export_rollout_files(trial, "r-1", config=settings.current())
    assert report is not None and report.files == 2 and len(report.over_limit) == 2
    monkeypatch.setenv("OSMOSIS_HARBOR_EXPORT_MAX_FILES", "100")
    monkeypatch.setenv("OSMOSIS_HARBOR_EXPORT_MAX_BYTES", "5")
    report = export_rollout_files(trial, "r-2", config=settings.current())
    assert report is not None and report.bytes <= 5 and report.over_limit


def test_the_export_reads_nothing_but_the_trial_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial directory's own entries are links only as our extraction keeps them (inside
    the tree); one that leads out (planted after extraction) is not read through."""
    trial, root, secret = tmp_path / "trial", tmp_path / "root", tmp_path / "host-secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE\n")
    (trial / "artifacts" / "logs").mkdir(parents=True)
    (trial / "artifacts" / "logs" / "artifacts").symlink_to(secret, target_is_directory=True)
    (trial / "agent").symlink_to(secret, target_is_directory=True)
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(root))
    export_rollout_files(trial, "r-1", config=settings.current())
    assert not any(b"PRIVATE" in p.read_bytes() for p in root.rglob("*") if p.is_file())
