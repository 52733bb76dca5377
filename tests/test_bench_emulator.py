"""``python -m bench --env skypilot-emulator`` at its smallest: it measures on a server of its own
and leaves no sandbox, pool, registry tag or temp dir behind (positive control: the server's own
call counts show it created sandboxes and a pool)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import docker
import docker.errors

from bench.emulator_path import SANDBOX_IMAGE, run
from bench.emulator_server import LOCAL_REGISTRY
from osmosis_harbor.sandbox import docker as docker_sdk

from .leaks import session_leaks


def _tag_exists(ref: str) -> bool:
    try:
        docker.from_env().images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def _bench_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("osmosis-bench-emulator-*"))


async def test_the_emulator_bench_leaves_nothing_behind() -> None:
    ref = f"{LOCAL_REGISTRY}/{SANDBOX_IMAGE}"
    tagged_before, dirs_before = _tag_exists(ref), _bench_dirs()
    started = time.time() - 1
    result = await run(True, latency_ms=0, cold_create_sec=0, pool_claim_sec=0, smallest=True)
    assert result.error is None and not result.warnings, result.warnings
    routes = result.info["API calls by route"]
    assert routes.get("POST /sandboxes", 0) >= 3 and routes.get("POST /pools") == 1, routes  # it made things
    assert result.info["archive capability"] is False
    assert result.headline["emulator_floor_calls"] is not None and result.headline["emulator_pool_over_cold"]
    pid = result.info["server pid"]
    left = [n for _, n in session_leaks(started, {pid})]
    assert left == [], f"the bench's emulator server left sandboxes: {left}"
    assert not [p.spec.name for p in docker_sdk.list_pools() if p.spec.name.startswith(f"bench{os.getpid()}-emu")]
    assert _tag_exists(ref) == tagged_before, "the bench changed the engine's registry tags"
    assert _bench_dirs() == dirs_before, "the bench left its server directory"
