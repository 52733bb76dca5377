"""The benchmarks' promise (docs/performance.md, "Benchmarks"): every sandbox, pool and image a run creates
is removed. ``overhead``, ``throughput``, ``bundle``, ``prewarm`` and ``admission`` run in one
``python -m bench --quick`` process with their sizes cut to the smallest that still runs every
code path (``soak`` and latency have their own tests); then nothing of that process is left:
no sandbox it owns, no pool of its prefix, no image it built, no temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docker
import docker.errors
import pytest

from osmosis_harbor.sandbox import docker as docker_sdk
from tests.support.common import REPO, managed_containers

# exclusive: the run removes the images it built, by tag, from the engine every test shares
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

NAMES = ["overhead", "throughput", "bundle", "prewarm", "admission"]
DRIVER = """
import sys

import bench.admission as a
import bench.bundle_build as b
import bench.overhead as o
import bench.prewarm as p
import bench.throughput as t

o.sizes = lambda quick: o.Sizes(rollouts=1, graded=1, task_tests=1, server=1, latency_rollouts=1, latency_graded=1)
t.sizes = lambda quick: t.Sizes(rollouts=1, concurrency=1, repeats=1)
b.sizes = lambda quick: b.Sizes(cold=1, hits=1)
p.sizes = lambda quick: p.Sizes(tasks=2, environments=1, repeats=1)
a.sizes = lambda quick: a.Sizes(queued=20, requests=5)

import json

import osmosis_harbor.sandbox.environment.images as environment

from bench.__main__ import main

built = []  # every image this process builds, whichever coordinator asked for it
real_build = environment.build_image


def recording_build(context_dir, dockerfile, ref, platform):
    built.append(ref)
    return real_build(context_dir, dockerfile, ref, platform)


environment.build_image = recording_build
code = main(sys.argv[1:])
print(json.dumps({"built": built}))
sys.exit(code)
"""


def _present(ref: str) -> bool:
    try:
        docker.from_env().images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def test_a_benchmark_run_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "--quick", "--latency-ms", "0", "--only", ",".join(NAMES), "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]
    results = json.loads(out.read_text())["benchmarks"]
    assert sorted(results) == sorted(NAMES)
    for name, result in results.items():
        assert result["info"]["leftovers after benchmark"] == 0, (name, result)
    assert "left behind" not in stdout and "image not removed" not in stdout, stdout[-4000:]
    # checked here too, not only by the run's own hygiene
    assert managed_containers(owner_pid=proc.pid) == []
    assert [p.name for p in docker_sdk.list_pools() if p.name.startswith(f"bench{proc.pid}")] == []
    built = json.loads(stdout.strip().splitlines()[-1])["built"]
    assert built, "the run built no image, so its image cleanup was not exercised"  # prewarm's always build
    assert [ref for ref in built if _present(ref)] == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("osmosis-bench-")] == []
