"""The SkyPilot recipes in sky/: they run locally (Docker) when no SkyPilot endpoint is
configured and say exactly what is missing when one is."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import docker as docker_sdk
from tests.support.common import FIXTURES, REPO

pytestmark = pytest.mark.slow


def run_recipe(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "HARBOR_SKYPILOT"))}
    return subprocess.run(
        ["bash", str(REPO / "sky" / script), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**clean, **env},
    )


def test_ci_recipe_validates_locally_without_an_endpoint(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proc = run_recipe("ci-validate.sh", str(FIXTURES / "nested-dataset"), env={"OSMOSIS_HARBOR_CI_REPORT": str(report)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["environment"] == "docker" and data["passed"] == 2 and data["failed"] == 0


def test_ci_recipe_on_skypilot_names_what_is_missing(tmp_path: Path) -> None:
    no_registry = run_recipe("ci-validate.sh", env={"SKYPILOT_API_SERVER_ENDPOINT": "http://127.0.0.1:9"})
    assert no_registry.returncode == 2 and "HARBOR_SKYPILOT_REGISTRY" in no_registry.stderr
    no_sdk = run_recipe(
        "ci-validate.sh",
        env={"SKYPILOT_API_SERVER_ENDPOINT": "http://127.0.0.1:9", "HARBOR_SKYPILOT_REGISTRY": "127.0.0.1:5000"},
    )
    assert no_sdk.returncode == 2 and "SkyPilot Platform installer" in no_sdk.stderr


def test_warm_pool_recipe_creates_the_template_pool_locally() -> None:
    name = f"skyrecipe{uuid.uuid4().hex[:6]}"
    try:
        proc = run_recipe("warm-pool.sh", env={"POOL_NAME": name, "POOL_SIZE": "1"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        pools = [p for p in docker_sdk.list_pools() if p.name.startswith(name)]
        assert len(pools) == 1 and pools[0].replicas == 1
    finally:  # what `cleanup --pool` does for it (that command: the README's prewarm block)
        for pool in docker_sdk.list_pools():
            if pool.name.startswith(name):
                docker_sdk.delete_pool(pool.name)
    assert not [p for p in docker_sdk.list_pools() if p.name.startswith(name)]
