"""The skypilot-emulator under our own tools: ``sandbox-check --sdk skypilot-emulator`` and a real
Harbor trial (``validate --env skypilot-emulator``), images pushed to and pulled from the local
registry on 127.0.0.1:5000. Prewarm, a claim from its pool and cleanup on the emulator run in
``tests/e2e/sandbox/test_pool_naming.py``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from harbor.environments.base import environment_content_hash

from tests.support.common import REPO, copy_task, run_cli
from tests.support.emulator import (
    LOCAL_REGISTRY,
    EmulatorServer,
    private_emulator,
    registry_tags,
)

SHARED_REPOSITORY = "osmosis-harbor-env"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    with private_emulator(tmp_path_factory.mktemp("emulator"), set_env=False) as server:
        yield server


def test_validate_runs_a_harbor_trial_through_the_registry(emulator: EmulatorServer, tmp_path: Path) -> None:
    task = copy_task(REPO / "tasks" / "hello-reward-txt", tmp_path / "tasks" / "hello-reward-txt")
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + f"LABEL emulator-test={uuid.uuid4().hex}\n")  # a fresh image
    ref = f"{LOCAL_REGISTRY}/{SHARED_REPOSITORY}:{environment_content_hash(task / 'environment', docker_image=None)}"
    assert ref.rsplit(":", 1)[1] not in registry_tags(SHARED_REPOSITORY)
    env = {"OSMOSIS_HARBOR_EMULATOR_URL": emulator.url, "COLUMNS": "200"}

    first = run_cli("validate", str(task), "--env", "skypilot-emulator", "--json", str(tmp_path / "1.json"), env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert json.loads((tmp_path / "1.json").read_text())["passed"] == 1
    assert ref.rsplit(":", 1)[1] in registry_tags(SHARED_REPOSITORY), f"{ref} was not pushed"

    # Without the local copy, the trial still runs: the server pulls the image from the registry.
    client = docker.from_env()
    client.images.remove(ref, force=True)
    second = run_cli("validate", str(task), "--env", "skypilot-emulator", "--json", str(tmp_path / "2.json"), env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert json.loads((tmp_path / "2.json").read_text())["passed"] == 1
    try:
        client.images.get(ref)  # back on the engine: the server pulled it (it never uses an unpushed tag)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{ref} was not pulled back from the registry")


def test_the_emulator_is_registered_with_skypilots_limits() -> None:
    from osmosis_harbor.errors import ConfigError
    from osmosis_harbor.sandbox import environment_config, load_sandbox_sdk
    from osmosis_harbor.sandbox.sdk.registry import SDK_NAMES, implementation, name_of

    impl = implementation("skypilot-emulator")
    assert not impl.reaches_host and not impl.local_images and impl.default_registry == LOCAL_REGISTRY
    assert "skypilot-emulator" in SDK_NAMES
    sdk = load_sandbox_sdk("skypilot-emulator")
    assert name_of(sdk) == "skypilot-emulator"
    for call in ("create", "ls", "create_pool", "set_pool_size", "delete_pool", "aclose"):
        assert callable(getattr(sdk, call)) and callable(getattr(sdk, call).aio)
    for beyond in ("get_pool", "list_pools", "terminate_by_name"):  # not SkyPilot's SDK: not offered
        assert not hasattr(sdk, beyond), beyond
    assert environment_config("skypilot-emulator").kwargs["sdk"] == "skypilot-emulator"
    with pytest.raises(ConfigError, match="host_network"):
        environment_config("skypilot-emulator", host_network=True)


def test_the_server_listens_on_loopback_only() -> None:
    refused = run_cli("emulator", "--host", "0.0.0.0", "--port", "0")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: the emulator listens on loopback only (127.0.0.1 or ::1), not '0.0.0.0'"
    ]
