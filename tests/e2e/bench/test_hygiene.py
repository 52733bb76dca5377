"""The benchmarks' promise (docs/performance.md, "Benchmarks"): every sandbox, pool and image a run creates
is removed. ``overhead``, ``throughput``, ``bundle``, ``prewarm`` and ``admission`` run in one
``python -m bench --quick`` process with their sizes cut to the smallest that still runs every
code path (``soak`` and latency have their own tests); then nothing of that process is left:
no sandbox it owns, no pool of its prefix, no image it built, no temporary directory.

The run works on a copy of the template task whose Dockerfile carries a marker of its own, so every
image it builds (and must remove) is content-addressed to this run alone: no other test on the
shared engine uses, holds or removes it, and the run's clean-up touches nothing of theirs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest

from bench.env import own_pool
from osmosis_harbor.sandbox import docker as docker_sdk
from tests.support.common import REPO, managed_containers

pytestmark = pytest.mark.slow

NAMES = ["overhead", "throughput", "bundle", "prewarm", "admission"]
DRIVER = """
import os
import sys
from pathlib import Path

import bench.admission as a
import bench.bundle_build as b
import bench.env as e
import bench.overhead as o
import bench.prewarm as p
import bench.throughput as t

e.TEMPLATE = p.TEMPLATE = Path(os.environ["BENCH_TEMPLATE"])

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
    built.append({"ref": ref, "dockerfile": Path(context_dir, dockerfile).read_text()})
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


def _own_template(tmp_path: Path) -> tuple[Path, str]:
    """``tasks/template`` with a marker comment (another environment hash, the same cached
    layers), and the marker."""
    template = Path(shutil.copytree(REPO / "tasks" / "template", tmp_path / "template"))
    marker = f"# this benchmark run's own: {uuid.uuid4().hex}"
    with (template / "environment" / "Dockerfile").open("a") as dockerfile:
        dockerfile.write(f"{marker}\n")
    return template, marker


def _foreign(builds: list[dict[str, str]], marker: str) -> list[str]:
    """Builds that are not this run's alone: neither its template copy's nor a prewarm environment
    (each of those carries a fresh ``RUN echo <uuid> > /bench-marker``)."""
    return [b["ref"] for b in builds if marker not in b["dockerfile"] and "> /bench-marker" not in b["dockerfile"]]


def test_a_benchmark_run_leaves_nothing_behind(tmp_path: Path) -> None:
    template, marker = _own_template(tmp_path)
    out = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "--quick", "--latency-ms", "0", "--only", ",".join(NAMES), "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO), "BENCH_TEMPLATE": str(template)},
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
    assert [p.name for p in docker_sdk.list_pools() if own_pool(p.name, proc.pid)] == []
    builds = json.loads(stdout.strip().splitlines()[-1])["built"]
    built = [build["ref"] for build in builds]
    assert _foreign(builds, marker) == [], "the run built an image other tests may share"
    assert any(marker in build["dockerfile"] for build in builds), f"no image of the run's template: {built}"
    assert [ref for ref in built if _present(ref)] == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("osmosis-bench-")] == []
