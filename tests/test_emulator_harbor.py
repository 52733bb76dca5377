"""The skypilot-emulator under our own tools: ``sandbox-check --sdk skypilot-emulator`` and a real
Harbor trial (``validate --env skypilot-emulator``), images pushed to and pulled from the local
registry on 127.0.0.1:5000."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from .emulator_support import (
    LOCAL_REGISTRY,
    EmulatorServer,
    registry_tags,
    remove_emulator_sandboxes,
    start_server,
    stop_server,
)
from .support import REPO, copy_task, run_cli

SHARED_REPOSITORY = "osmosis-harbor-env"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    server = start_server(tmp_path_factory.mktemp("emulator"))
    yield server
    left = remove_emulator_sandboxes()
    stop_server(server)
    assert not left, f"tests left emulator sandboxes: {left}"


def test_sandbox_check_passes_on_the_emulator(emulator: EmulatorServer, tmp_path: Path) -> None:
    report = tmp_path / "check.json"
    done = run_cli(
        "sandbox-check",
        "--sdk",
        "skypilot-emulator",
        "--json",
        str(report),
        env={"OSMOSIS_HARBOR_EMULATOR_URL": emulator.url, "COLUMNS": "200"},
    )
    results = json.loads(report.read_text())
    failed = [r for r in results if not r["passed"]]
    assert done.returncode == 0 and not failed, failed or done.stdout[-3000:]
    by_name = {r["name"]: r for r in results}
    # the default image (a local one) was published to the registry and pulled by reference
    assert f"{LOCAL_REGISTRY}/debian" in done.stdout
    assert by_name["ls_lists_sandbox"]["detail"] == "status RUNNING"
    assert by_name["environment_image_by_content_hash"]["detail"].startswith(f"{LOCAL_REGISTRY}/{SHARED_REPOSITORY}:")
    assert emulator.stats()["calls"] > 0  # every check went through the server


def test_validate_runs_a_harbor_trial_through_the_registry(emulator: EmulatorServer, tmp_path: Path) -> None:
    task = copy_task(REPO / "tasks" / "hello-reward-txt", tmp_path / "tasks" / "hello-reward-txt")
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + f"LABEL emulator-test={uuid.uuid4().hex}\n")  # a fresh image
    before = set(registry_tags(SHARED_REPOSITORY))
    env = {"OSMOSIS_HARBOR_EMULATOR_URL": emulator.url, "COLUMNS": "200"}

    first = run_cli("validate", str(task), "--env", "skypilot-emulator", "--json", str(tmp_path / "1.json"), env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert json.loads((tmp_path / "1.json").read_text())["passed"] == 1
    new = set(registry_tags(SHARED_REPOSITORY)) - before
    assert len(new) == 1, f"expected the task's image to be pushed once, got {new}"
    ref = f"{LOCAL_REGISTRY}/{SHARED_REPOSITORY}:{new.pop()}"

    # Without the local copy, the trial still runs: the server pulls the image from the registry.
    client = docker.from_env()
    client.images.remove(ref, force=True)
    second = run_cli("validate", str(task), "--env", "skypilot-emulator", "--json", str(tmp_path / "2.json"), env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert json.loads((tmp_path / "2.json").read_text())["passed"] == 1
    try:
        client.images.get(ref)  # back on the engine: pulled by reference, not rebuilt
    except docker.errors.ImageNotFound:
        pytest.fail(f"{ref} was not pulled back from the registry")
    assert set(registry_tags(SHARED_REPOSITORY)) - before == {ref.rsplit(":", 1)[1]}
