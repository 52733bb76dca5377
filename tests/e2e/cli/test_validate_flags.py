"""The validate command's ``--keep-trials``, ``--registry`` and ``--force-build`` flags, as a
user runs them (README, "Oracle validation of a dataset").

One task names an image nobody can pull (``docker_image``) and has a Dockerfile: with
``--force-build`` it is built from the Dockerfile and passes (without it, the control, it fails
in the environment phase); ``--registry`` pushes the built image to the local registry
(127.0.0.1:5000, started by bootstrap); ``--keep-trials`` keeps the trials as a Harbor job
directory whose path the command prints.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support.common import load_json, make_task, run_cli

pytestmark = pytest.mark.slow

REGISTRY = "127.0.0.1:5000"


def _tags() -> set[str]:
    """Every ``repository:tag`` in the local registry."""

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/{path}", timeout=10) as response:
            return json.loads(response.read())

    found = set()
    for repository in get("_catalog").get("repositories") or []:
        found |= {f"{repository}:{tag}" for tag in get(f"{repository}/tags/list").get("tags") or []}
    return found


def test_keep_trials_registry_and_force_build(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    make_task(
        tmp_path / "ds",
        "prebuilt",
        dockerfile=f"FROM debian:trixie-slim\nRUN echo {marker} > /marker\n",
        toml_extra='docker_image = "registry.invalid/osmosis/none:1"\n',
    )
    control = tmp_path / "control.json"
    proc = run_cli("validate", str(tmp_path / "ds"), "--json", str(control))
    assert proc.returncode == 1 and load_json(control)["tasks"][0]["failed_phase"] == "environment", proc.stdout

    before = _tags()
    report = tmp_path / "report.json"
    proc = run_cli(
        "validate",
        str(tmp_path / "ds"),
        "--force-build",
        "--registry",
        REGISTRY,
        "--keep-trials",
        "--json",
        str(report),
        env={"TMPDIR": str(tmp_path)},  # the kept job lives in a temp dir: this test's
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = load_json(report)
    assert data["passed"] == 1, data
    pushed = _tags() - before
    assert pushed, "nothing was pushed to the registry"
    job = Path(data["job_dir"])
    assert job.is_relative_to(tmp_path)
    assert str(job) in "".join(proc.stdout.split()), "the command prints the kept job's path"
    assert (job / "config.json").is_file() and (job / "result.json").is_file()
    trials = [d for d in job.iterdir() if (d / "result.json").is_file()]
    assert len(trials) == 1 and (trials[0] / "verifier" / "reward.txt").read_text().strip() == "1"
