"""The ``prewarm``, ``rollout`` and ``cleanup`` commands as a user runs them. The calc example's
rollout end to end is the README's "One rollout locally" block (``test_readme.py``)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import docker as docker_sdk
from tests.support.common import REPO, TASKS, load_json, run_cli

pytestmark = pytest.mark.slow

CALC = [
    "--workflow",
    "calc_agent.workflow:CalcWorkflow",
    "--workflow-config",
    "calc_agent.workflow:calc_config",
    "--grader",
    "calc_agent.grader:CalcGrader",
    "--grader-config",
    "calc_agent.grader:calc_grader_config",
]


def fresh_calc_agent(dest: Path) -> list[str]:
    """``--code-dir`` of the calc example's project with a line of its own: a bundle, and so an
    image, that no run has built yet, whose layers up to the wheel's are the ones every calc image
    on the template's Dockerfile shares (its dependencies are installed once per machine, not once
    per run)."""
    project = shutil.copytree(
        REPO / "examples" / "calc_agent", dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    )
    init = project / "calc_agent" / "__init__.py"
    init.write_text(init.read_text() + f"\n# a bundle of this test's own: {uuid.uuid4().hex}\n")
    return ["--code-dir", str(project)]


def left_in(tmpdir: Path) -> list[str]:
    """What our commands left in their temporary directory (TMPDIR points at a fresh one)."""
    return sorted(p.name for p in tmpdir.glob("osmosis-harbor-*"))


def test_prewarm_builds_once_reuses_after_sizes_pools_and_exits_nonzero_on_a_failure(
    tmp_path: Path, bundles_dir: Path
) -> None:
    """One group of three tasks with a fresh image (the template's environment, a bundle of the
    test's own), beside a task whose build fails: the failure is reported with exit 1 while the
    good group is built, set up and pooled; a second run of the good tasks reuses the image and
    resizes the pool."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    dataset = tmp_path / "ds"
    calc = [*fresh_calc_agent(tmp_path / "calc_agent"), *CALC]
    for name in ("one", "two", "group/three"):
        shutil.copytree(TASKS / "template", dataset / name)
    shutil.copytree(REPO / "tests" / "fixtures" / "broken" / "build-fails", dataset / "bad")
    pool = f"cli{uuid.uuid4().hex[:6]}"
    first_json, second_json = tmp_path / "first.json", tmp_path / "second.json"
    try:
        first = run_cli(
            "prewarm",
            str(dataset),
            *calc,
            "--pool",
            pool,
            "--pool-size",
            "1",
            "--json",
            str(first_json),
            "--bundles-dir",
            str(bundles_dir),  # the session's: images and pools are what is counted
            env={"TMPDIR": str(tmpdir)},
        )
        assert first.returncode == 1, first.stdout + first.stderr  # a task failed
        assert left_in(tmpdir) == []  # no work root, no trials dir: a prewarm runs no rollout
        report = load_json(first_json)
        assert (report["groups"], report["tasks"], report["built"], report["reused"], report["failed"]) == (
            2,
            4,
            1,
            0,
            1,
        )
        assert list(report["failed_tasks"]) == ["bad"]
        assert "docker build failed" in first.stdout
        (group,) = [g for g in report["groups_detail"] if "bad" not in g["task_ids"]]
        assert sorted(group["task_ids"]) == ["group/three", "one", "two"] and group["setup_ok"]
        assert docker_sdk.get_pool(group["pool"]).replicas == 1
        assert "1 built" in first.stdout

        second = run_cli(
            "prewarm",
            str(dataset),
            *calc,
            *("--task", "one", "--task", "two", "--task", "group/three"),
            "--pool",
            pool,
            "--pool-size",
            "2",
            "--json",
            str(second_json),
            "--bundles-dir",
            str(bundles_dir),
        )
        assert second.returncode == 0, second.stdout + second.stderr
        again = load_json(second_json)
        assert (again["built"], again["reused"], again["failed"]) == (0, 1, 0)
        assert docker_sdk.get_pool(group["pool"]).replicas == 2  # resized
    finally:
        cleaned = run_cli("cleanup", "--pool", pool)
        assert cleaned.returncode == 0, cleaned.stderr
    assert not [p for p in docker_sdk.list_pools() if p.name.startswith(pool)]


def test_rollout_command_needs_an_endpoint() -> None:
    proc = run_cli("rollout", "examples/calc_task", "--code-dir", "examples/calc_agent", *CALC, "--prompt", "hi")
    assert proc.returncode == 2 and "--chat-url" in proc.stderr
