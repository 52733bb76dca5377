"""``python -m bench --env skypilot-emulator`` at its smallest: it measures on a server of its own
and leaves no sandbox, pool, image, registry tag or temp dir behind (positive control: the
server's own call counts show it created sandboxes, a pool and rollouts' transfers)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import docker
import docker.errors
import pytest

from bench.__main__ import main
from bench.emulator_path import SANDBOX_IMAGE
from bench.emulator_server import LOCAL_REGISTRY
from osmosis_harbor.sandbox import docker as docker_sdk
from tests.support.leaks import session_leaks


def _tag_exists(ref: str) -> bool:
    try:
        docker.from_env().images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def _bench_dirs() -> set[Path]:
    return {p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("osmosis-bench-")}


# exclusive: it compares the engine's tag of the registry image and the temp dirs of /tmp before and
# after, which another worker's session fixtures and tests also make
@pytest.mark.exclusive
def test_the_emulator_bench_leaves_nothing_behind(tmp_path: Path) -> None:
    ref = f"{LOCAL_REGISTRY}/{SANDBOX_IMAGE}"
    tagged_before, dirs_before = _tag_exists(ref), _bench_dirs()
    started = time.time() - 1
    out = tmp_path / "bench.json"
    argv = ["--env", "skypilot-emulator", "--quick", "--smallest", "--latency-ms", "0", "--out", str(out)]
    assert main([*argv, "--cold-create-sec", "0", "--pool-claim-sec", "0"]) == 0
    payload = json.loads(out.read_text())
    bench = payload["benchmarks"]["emulator"]
    assert bench["error"] is None and not bench["warnings"], bench["warnings"]
    routes = bench["info"]["API calls by route"]
    assert routes.get("POST /sandboxes", 0) >= 5 and routes.get("POST /pools") == 1, routes  # it made things
    assert routes.get("PUT /sandboxes/{name}/files", 0) > 0, routes  # the rollouts' transfers, no archives
    assert bench["info"]["archive capability"] is False
    headline = bench["headline"]
    assert headline["emulator_calls_trivial"] and headline["emulator_calls_graded"], headline
    top = payload["emulator"]  # the figures docs/performance.md names, at the top level
    assert top["sdk_calls_graded"] == headline["emulator_calls_graded"] and top["sdk_calls_trivial"], top
    assert top["sdk_sec_graded_at_80ms"] == round(top["sdk_calls_graded"] * 0.080, 3), top
    assert headline["emulator_pool_over_cold"], headline
    left = [n for _, n in session_leaks(started, {bench["info"]["server pid"]})]
    assert left == [], f"the bench's emulator server left sandboxes: {left}"
    assert not [p.spec.name for p in docker_sdk.list_pools() if p.spec.name.startswith(f"bench{os.getpid()}")]
    assert _tag_exists(ref) == tagged_before, "the bench changed the engine's registry tags"
    assert not [image for image in payload["meta"]["images_built"] if _tag_exists(image)], "built images kept"
    assert _bench_dirs() == dirs_before, "the bench left a temp dir"
