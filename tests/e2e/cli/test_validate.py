"""``python -m osmosis_harbor validate``: real trials through Harbor's TrialQueue in Docker
sandboxes, judged by reward, reported per phase; bad input as one-line errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.owner.context import SandboxOwner
from osmosis_harbor.tasks.discovery import discover_tasks, load_dataset
from osmosis_harbor.validate import validate_tasks
from tests.support.common import FIXTURES, REPO, TASKS, load_json, make_task, managed_containers, run_cli, wait_until
from tests.support.sdk_paths import SdkPath

pytestmark = pytest.mark.slow

# An image every run has: where the image is not what a test checks, its tasks build none.
PLAIN = "FROM debian:trixie-slim\n"


# On the Docker path this is README command 1 (`validate tasks`), which test_readme.py runs as
# written and checks the same way from its output: the same flow twice costs a run of every task.
@pytest.mark.parametrize("sandbox_sdk", ["skypilot-emulator"], indirect=True)
def test_bundled_dataset_passes_oracle_validation(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    report_path = tmp_path / "report.json"
    routes = sandbox_sdk.routes()
    proc = run_cli(
        "validate", "tasks", "--env", sandbox_sdk.name, "-n", "3", "--json", str(report_path), env=sandbox_sdk.cli_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sandbox_sdk.assert_harbors_transfer_path(routes)
    assert not sandbox_sdk.sandboxes_left()
    report = load_json(report_path)
    ids = {t.id for t in discover_tasks(TASKS)}
    assert {t["id"] for t in report["tasks"]} == ids
    assert len(ids) >= 6 and report["passed"] == len(ids) and report["failed"] == 0
    for task in report["tasks"]:
        assert task["passed"] and task["reward"] == 1.0 and task["failed_phase"] is None
        assert {"environment", "agent", "verifier", "total"} <= set(task["timings_sec"])
    assert "files/workdir-task" in proc.stdout and "6 passed, 0 failed" in proc.stdout


def test_broken_tasks_are_reported_with_their_failing_phase(tmp_path: Path) -> None:
    """Each broken task fails in its own phase, a symlink loop in one task's environment fails
    that task alone (in phase ``task``, one line), and a good task beside them still passes."""
    dataset = tmp_path / "ds"
    shutil.copytree(FIXTURES / "broken", dataset, symlinks=True)
    make_task(dataset, "good", dockerfile=PLAIN)
    looped = make_task(dataset, "looped", dockerfile=PLAIN)
    (looped / "environment" / "a").symlink_to("b")
    (looped / "environment" / "b").symlink_to("a")
    report_path = tmp_path / "report.json"
    proc = run_cli("validate", str(dataset), "-n", "4", "--json", str(report_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {t["id"]: t for t in load_json(report_path)["tasks"]}
    assert {k: (v["passed"], v["failed_phase"]) for k, v in rows.items()} == {
        "bad-toml": (False, "task"),
        "build-fails": (False, "environment"),
        "reward-zero": (False, "verifier"),
        "solve-fails": (False, "agent"),
        "looped": (False, "task"),
        "good": (True, None),
    }
    assert "task.toml" in rows["bad-toml"]["error"] and "malformed TOML" in rows["bad-toml"]["error"]
    assert "docker build failed" in rows["build-fails"]["error"]
    assert rows["reward-zero"]["reward"] == 0.0 and "(expected 1)" in rows["reward-zero"]["error"]
    assert rows["solve-fails"]["error"].startswith("solve.sh exited with status 3\n--- solve.sh output")
    error = rows["looped"]["error"]
    assert "environment/a" in error and "is a loop" in error and "\n" not in error, error
    assert load_json(report_path)["passed"] == 1


def test_bad_input_is_a_one_line_error() -> None:
    """The whole process's stderr is the one line (nothing from imports or logging around it);
    each kind of bad input, the unknown task id and the missing SkyPilot SDK are checked on
    ``main`` in tests/unit/cli/test_bad_input.py."""
    proc = run_cli("validate", "does/not/exist")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "no such file or directory" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_nested_ids_are_discovered_and_selectable(tmp_path: Path) -> None:
    ids = [t.id for t in discover_tasks(FIXTURES / "nested-dataset")]
    assert ids == ["group/sub/tiny-task", "top-task"]
    report_path = tmp_path / "r.json"
    proc = run_cli(
        "validate", str(FIXTURES / "nested-dataset"), "--task", "group/sub/tiny-task", "--json", str(report_path)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [t["id"] for t in load_json(report_path)["tasks"]] == ["group/sub/tiny-task"]


async def test_tasks_sharing_an_environment_build_its_image_once(tmp_path: Path, monkeypatch) -> None:
    """Two tasks, run at once, are enough for the race a shared build must win (each trial asks
    for the image before the other's build ends); more only add sandboxes."""
    first, second = make_task(tmp_path / "ds", "a"), make_task(tmp_path / "ds", "b")
    # identical environment/ => identical content hash => one image
    (second / "environment" / "Dockerfile").write_text((first / "environment" / "Dockerfile").read_text())
    tasks = load_dataset(tmp_path / "ds")
    made: list[SandboxOwner] = []
    make = SandboxOwner.make

    def noted(label: str, **kwargs) -> SandboxOwner:
        made.append(make(label, **kwargs))
        return made[-1]

    monkeypatch.setattr(SandboxOwner, "make", noted)
    report = await validate_tasks(tasks, environment=environment_config("docker"), n_concurrent=4)
    assert report.passed == 2, report.model_dump()
    [run] = [owner for owner in made if owner.label == "validate"]  # the run's owner builds
    assert len(run.builds.stats.built) == 1, run.builds.stats


# --force-build over an unpullable docker_image, with its control (the same task failing without
# it): tests/e2e/cli/test_validate_flags.py, through the command a user runs.


def test_ctrl_c_leaves_no_sandbox(tmp_path: Path) -> None:
    make_task(tmp_path / "ds", "slow-1", solve="sleep 120", dockerfile=PLAIN)
    make_task(tmp_path / "ds", "slow-2", solve="sleep 120", dockerfile=PLAIN)
    tmpdir = tmp_path / "tmpdir"  # where the run's own trials dir is made: this test's, not /tmp
    tmpdir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "osmosis_harbor", "validate", str(tmp_path / "ds"), "-n", "2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    try:
        wait_until(
            lambda: len(managed_containers(owner_pid=proc.pid)) == 2, timeout=120, what="both sandboxes to start"
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert managed_containers(owner_pid=proc.pid) == []
    assert list(tmpdir.iterdir()) == [], "the interrupted run left its trials dir behind"


def test_nop_agent_checks_that_tests_reject_an_untouched_sandbox(tmp_path: Path) -> None:
    make_task(tmp_path / "ds", "honest", dockerfile=PLAIN)  # test.sh gives 0 unless /tmp/done exists
    make_task(tmp_path / "ds", "lenient", test="echo 1 > /logs/verifier/reward.txt\n", dockerfile=PLAIN)  # always 1
    report_path = tmp_path / "r.json"
    proc = run_cli("validate", str(tmp_path / "ds"), "--agent", "nop", "--json", str(report_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {t["id"]: t for t in load_json(report_path)["tasks"]}
    assert rows["honest"]["passed"] and rows["honest"]["reward"] == 0.0
    assert not rows["lenient"]["passed"] and rows["lenient"]["error"] == "reward 1 (expected 0)"
