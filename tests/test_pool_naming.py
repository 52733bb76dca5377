"""``pool`` means one thing everywhere: a base name, under which prewarm creates one warm
pool per environment group and every trial of that group (validate's, a rollout's) claims
from exactly that pool."""

from __future__ import annotations

import uuid

import pytest

from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.docker import labels as L

from .support import TASKS, load_json, run_cli

pytestmark = pytest.mark.slow


def _network_modes(pool: str) -> set[str]:
    """The Docker network mode of every container of ``pool`` (``none``: no network at all)."""
    api = docker_sdk.get_engine().api
    members = api.containers(all=True, filters={"label": [L.MANAGED_FILTER, f"{L.POOL}={pool}"]})
    return {api.inspect_container(c["Id"])["HostConfig"]["NetworkMode"] for c in members}


def test_validate_claims_the_pools_prewarm_made(tmp_path) -> None:
    base = f"pn{uuid.uuid4().hex[:6]}"
    prewarm_json = tmp_path / "prewarm.json"
    try:
        proc = run_cli(
            "prewarm",
            str(TASKS),
            "--task",
            "files/offline-task",
            "--task",
            "hello-reward-txt",
            "--pool",
            base,
            "--json",
            str(prewarm_json),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        pools = {g["task_ids"][0]: g["pool"] for g in load_json(prewarm_json)["groups_detail"]}
        assert set(pools) == {"files/offline-task", "hello-reward-txt"}
        assert all(p.startswith(f"{base}-") for p in pools.values()) and len(set(pools.values())) == 2
        # The no-network task's pool holds sandboxes without a network, like its trials; the
        # other task's pool (the control) has one.
        assert docker_sdk.get_pool(pools["files/offline-task"]).replicas == 1
        assert _network_modes(pools["files/offline-task"]) == {"none"}
        assert _network_modes(pools["hello-reward-txt"]) and "none" not in _network_modes(pools["hello-reward-txt"])

        report = tmp_path / "validate.json"
        proc = run_cli(
            "validate",
            str(TASKS),
            "--task",
            "files/offline-task",
            "--task",
            "hello-reward-txt",
            "--pool",
            base,
            "--json",
            str(report),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert load_json(report)["passed"] == 2

        # A task whose environment group was not prewarmed: its pool does not exist, and the
        # error names the pool it looked for and how to make it.
        other = tmp_path / "other.json"
        proc = run_cli("validate", str(TASKS), "--task", "json-reward", "--pool", base, "--json", str(other))
        row = load_json(other)["tasks"][0]
        assert proc.returncode == 1 and row["failed_phase"] == "environment"
        assert f"warm pool '{base}-" in row["error"] and f"prewarm <tasks> --pool {base}" in row["error"]
    finally:
        run_cli("cleanup", "--pool", base)
    assert not [p for p in docker_sdk.list_pools() if p.name.startswith(base)]
