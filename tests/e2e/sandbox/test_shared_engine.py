"""A shared engine stays safe: one process's clean-up (the bench's image removal, ``cleanup
--pool``) never removes an image or a warm pool another live process is using. Two real
processes on the real engine; each refusal has its positive control (once the other process is
gone, the same clean-up removes the thing)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import docker
import docker.errors
import pytest

from bench.env import remove_images
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.images import holds as image_holds
from osmosis_harbor.sandbox.images.builds import local_image_exists
from tests.support.common import REPO, run_cli

# The other process: it uses the image the way a trial does (the build coordinator's ensure),
# or claims a member of the pool, says so, and waits until it is told to go.
USER = textwrap.dedent(
    """
    import asyncio, sys
    from osmosis_harbor.sandbox import docker as docker_sdk
    from osmosis_harbor.sandbox.images.builds import ImageBuildCoordinator, local_image_exists

    KIND, THING = sys.argv[1:3]

    async def main():
        if KIND == "image":
            async def exists():
                return local_image_exists(THING)
            async def build():
                raise AssertionError("the image is there: nothing to build")
            await ImageBuildCoordinator().ensure(THING, exists=exists, build=build)
            print("using", flush=True)
            sys.stdin.readline()
        else:
            sandbox = docker_sdk.create(pool=THING, timeout=600)
            print("using", flush=True)
            sys.stdin.readline()
            sandbox.terminate()

    asyncio.run(main())
    """
)


@pytest.fixture
def other_process() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def _use(started: list[subprocess.Popen[str]], kind: str, thing: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", USER, kind, thing],
        cwd=REPO,
        env=dict(os.environ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(process)
    assert process.stdout is not None and process.stdout.readline() == "using\n", "the other process did not start"
    return process


def _done(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.write("done\n")
    process.stdin.close()
    assert process.wait(timeout=120) == 0


def test_the_bench_keeps_an_image_another_live_process_uses(sandbox_image: str, other_process: list) -> None:
    repository, tag = "osmosis-harbor/env", f"shared-{uuid.uuid4().hex[:12]}"
    ref = f"{repository}:{tag}"
    docker.from_env().images.get(sandbox_image).tag(repository, tag)  # a content-addressed task image
    try:
        user = _use(other_process, "image", ref)
        kept = remove_images([ref])  # what the bench runs at its end for the images it built
        assert len(kept) == 1 and f"pid {user.pid}" in kept[0] and local_image_exists(ref)
        assert [o.pid for o in image_holds.holders(ref)] == [user.pid]
        _done(user)  # positive control: with the other process gone, the same clean-up removes it
        assert remove_images([ref]) == [] and not local_image_exists(ref)
        assert image_holds.holders(ref) == []  # the dead process's hold was dropped
    finally:
        try:
            docker.from_env().images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_cleanup_keeps_a_pool_another_live_process_claims_from(sandbox_image: str, other_process: list) -> None:
    pool = f"shared-{uuid.uuid4().hex[:6]}"
    docker_sdk.create_pool(pool, sandbox_image, replicas=1)
    try:
        user = _use(other_process, "pool", pool)
        kept = run_cli("cleanup", "--env", "docker", "--pool", pool, timeout=300)
        assert kept.returncode == 0, kept.stderr
        assert f"in use by pid {user.pid}" in kept.stdout and docker_sdk.get_pool(pool).claimed == 1
        _done(user)  # positive control
        gone = run_cli("cleanup", "--env", "docker", "--pool", pool, timeout=300)
        assert gone.returncode == 0 and "pool spec deleted" in gone.stdout, gone.stdout + gone.stderr
        with pytest.raises(docker_sdk.PoolNotFoundError):
            docker_sdk.get_pool(pool)
    finally:
        try:
            docker_sdk.delete_pool(pool)
        except docker_sdk.PoolNotFoundError:
            pass
