"""``pool`` means one thing everywhere: a base name, under which prewarm creates one warm
pool per environment group and every trial of that group (validate's, a rollout's) claims
from exactly that pool."""

from __future__ import annotations

import uuid

import httpx
import pytest

from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.docker import labels as L
from tests.support.common import TASKS, load_json, run_cli
from tests.support.sdk_paths import DOCKER, EMULATOR, SdkPath

pytestmark = pytest.mark.slow


def _network_modes(pool: str) -> set[str]:
    """The Docker network mode of every container of ``pool`` (``none``: no network at all)."""
    api = docker_sdk.get_engine().api
    members = api.containers(all=True, filters={"label": [L.MANAGED_FILTER, f"{L.POOL}={pool}"]})
    return {api.inspect_container(c["Id"])["HostConfig"]["NetworkMode"] for c in members}


def test_validate_claims_the_pools_prewarm_made(tmp_path) -> None:
    """On Docker's path (the default ``--env``) both groups of a mixed dataset get a pool, the
    offline one without a network, and validate claims from each, with no note."""
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
        groups = load_json(prewarm_json)["groups_detail"]
        assert load_json(prewarm_json)["failed"] == 0 and not any(g["error"] or g["pool_note"] for g in groups)
        pools = {g["task_ids"][0]: g["pool"] for g in groups}
        assert set(pools) == {"files/offline-task", "hello-reward-txt"}
        assert all(p.startswith(f"{base}-") for p in pools.values()) and len(set(pools.values())) == 2
        assert sorted(_pools_named(DOCKER, base)) == sorted(pools.values())
        # The no-network task's pool holds sandboxes without a network, like its trials; the
        # other task's pool (the control) has one.
        assert docker_sdk.get_pool(pools["files/offline-task"]).replicas == 1
        assert _network_modes(pools["files/offline-task"]) == {"none"}
        assert _network_modes(pools["hello-reward-txt"]) and "none" not in _network_modes(pools["hello-reward-txt"])

        # Beside them, a task whose environment group was not prewarmed: its pool does not
        # exist, and the error names the pool it looked for and how to make it (exit 1).
        report = tmp_path / "validate.json"
        proc = run_cli(
            "validate",
            str(TASKS),
            "--task",
            "files/offline-task",
            "--task",
            "hello-reward-txt",
            "--task",
            "json-reward",
            "--pool",
            base,
            "--json",
            str(report),
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert load_json(report)["passed"] == 2 and "runs cold" not in proc.stdout
        rows = {row["id"]: row for row in load_json(report)["tasks"]}
        row = rows.pop("json-reward")
        assert len(rows) == 2 and all(r["passed"] and r["pool_note"] is None for r in rows.values()), rows
        assert row["failed_phase"] == "environment"
        assert f"warm pool '{base}-" in row["error"] and f"prewarm <tasks> --pool {base}" in row["error"]
    finally:
        cleaned = run_cli("cleanup", "--pool", base)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert not [p for p in docker_sdk.list_pools() if p.name.startswith(base)]


def _pools_named(sandbox_sdk: SdkPath, base: str) -> list[str]:
    """The pools under ``base`` on this path's SDK (the emulator's own listing, or the engine's)."""
    if sandbox_sdk.emulator is not None:
        listed = httpx.get(f"{sandbox_sdk.emulator.url}/pools", timeout=30).json()
        return [p["name"] for p in listed if p["name"].startswith(f"{base}-")]
    return [p.name for p in docker_sdk.list_pools() if p.name.startswith(f"{base}-")]


@pytest.mark.parametrize("sandbox_sdk", [EMULATOR], indirect=True)
def test_a_task_no_pool_can_serve_runs_cold_in_a_mixed_dataset(tmp_path, sandbox_sdk: SdkPath) -> None:
    """One ``--pool`` for a dataset with a task that must have no network: on SkyPilot's path no
    pool can hold such a sandbox (create_pool has no network option), so prewarm makes the other
    task's pool (warm, one member), notes the offline one and exits 0, and validate claims from
    that pool and runs the offline task cold, without a network (its own test checks that), with
    the same note; cleanup deletes the pool. On Docker's both groups get a pool
    (``test_validate_claims_the_pools_prewarm_made``, the same flow there)."""
    assert sandbox_sdk.emulator is not None
    base = f"pc{uuid.uuid4().hex[:6]}"
    env = sandbox_sdk.cli_env()
    sdk = ["--env", sandbox_sdk.name]
    selected = ["--task", "files/offline-task", "--task", "hello-reward-txt", "--pool", base]
    prewarm_json, validate_json = tmp_path / "prewarm.json", tmp_path / "validate.json"
    try:
        proc = run_cli("prewarm", str(TASKS), *sdk, *selected, "--pool-size", "1", "--json", str(prewarm_json), env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        groups = {g["task_ids"][0]: g for g in load_json(prewarm_json)["groups_detail"]}
        assert load_json(prewarm_json)["failed"] == 0 and not any(g["error"] for g in groups.values())
        assert groups["hello-reward-txt"]["pool"].startswith(f"{base}-")
        offline = groups["files/offline-task"]
        assert offline["pool"] is None and offline["setup_ok"]
        assert offline["pool_note"].startswith(f"runs cold, not from warm pool '{base}': on skypilot-emulator")
        assert "create_pool takes no block_network=" in offline["pool_note"]
        assert f"note: {offline['key']}: runs cold" in proc.stdout
        assert _pools_named(sandbox_sdk, base) == [groups["hello-reward-txt"]["pool"]]
        listed = httpx.get(f"{sandbox_sdk.emulator.url}/pools", timeout=30).json()
        assert [p["idle"] for p in listed if p["name"].startswith(f"{base}-")] == [1], listed  # warm before validate

        proc = run_cli("validate", str(TASKS), *sdk, *selected, "--json", str(validate_json), env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = {row["id"]: row for row in load_json(validate_json)["tasks"]}
        assert all(row["passed"] for row in rows.values()) and len(rows) == 2
        assert rows["hello-reward-txt"]["pool_note"] is None
        assert rows["files/offline-task"]["pool_note"] == offline["pool_note"]
        assert "note: files/offline-task: runs cold" in proc.stdout
    finally:
        cleaned = run_cli("cleanup", *sdk, "--pool", base, env=env)
    assert cleaned.returncode == 0 and "pool deleted" in cleaned.stdout, cleaned.stdout + cleaned.stderr
    assert _pools_named(sandbox_sdk, base) == []
    assert sandbox_sdk.sandboxes_left() == []
