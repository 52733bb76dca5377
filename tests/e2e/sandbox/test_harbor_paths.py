"""Where our environment now leaves the work to Harbor's own ``SkypilotEnvironment`` code:

* a task with no environment definition launches from a named pool whose image is generic
  (SkyPilot's built-in ``default`` is one), claimed by its own name, with ``environment/``
  uploaded by Harbor's pool path, exactly as Harbor allows it;
* with a registry, images are built and pushed by Harbor's ``_build_and_push_image``; its
  failure reaches the trial as our ``ImageBuildError`` (phase ``environment``).

Real containers, a real warm pool on the Docker SDK, the local registry on 127.0.0.1:5000."""

from __future__ import annotations

import ast
import inspect
import logging
import re
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import docker.errors
import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.environments.skypilot import SkypilotEnvironment
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor.errors import BaseImageMissingError, ImageBuildError
from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
from osmosis_harbor.sandbox.environment import images as environment_images
from osmosis_harbor.sandbox.environment.images import ImageSource
from osmosis_harbor.sandbox.owner.pools import pool_name_for
from tests.support.common import make_task

REGISTRY = "127.0.0.1:5000"


def _environment(task_dir: Path, tmp_path: Path, **kwargs: Any) -> SandboxEnvironment:
    task = Task(task_dir)
    trial_paths = TrialPaths(tmp_path / f"trial-{uuid.uuid4().hex[:6]}")
    trial_paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        environment_config("docker", **kwargs),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"paths-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
    )
    assert isinstance(env, SandboxEnvironment)
    return env


def _undefined_task(root: Path, marker: str) -> Path:
    """A task with no Dockerfile and no docker_image; environment/ holds a loose file."""
    task = make_task(root, "undefined")
    (task / "environment" / "Dockerfile").unlink()
    (task / "environment" / "marker.txt").write_text(marker)
    return task


@pytest.fixture
def generic_pool(docker_sandbox_sdk: Any, sandbox_image: str) -> Iterator[str]:
    """A warm pool of the plain test image: a pool whose image knows nothing of any task."""
    name = f"generic-{uuid.uuid4().hex[:6]}"
    docker_sandbox_sdk.create_pool(name, sandbox_image, replicas=1)
    yield name
    docker_sandbox_sdk.delete_pool(name)


async def test_a_task_without_environment_definition_runs_from_a_named_generic_pool(
    tmp_path: Path, generic_pool: str, docker_sandbox_sdk: Any
) -> None:
    marker = f"from environment/ {uuid.uuid4().hex}\n"
    task = _undefined_task(tmp_path, marker)
    # Control: without a pool, such a task is refused, by Harbor's own check.
    with pytest.raises(FileNotFoundError, match="no environment definition"):
        _environment(task, tmp_path)
    env = _environment(task, tmp_path, pool=generic_pool)
    assert env.pool_name == generic_pool  # the pool's own name, not a group pool under it
    await env.start(force_build=False)
    try:
        claimed = {r.name: r.pool for r in docker_sandbox_sdk.ls()}
        assert claimed.get(env.sandbox_name) == generic_pool
        out = await env.exec("cat marker.txt")  # Harbor's pool path uploaded environment/ to the workdir
        assert (out.return_code, out.stdout) == (0, marker)
    finally:
        await env.stop(delete=True)


def test_a_defined_task_still_claims_its_group_pool_under_the_base_name(tmp_path: Path) -> None:
    env = _environment(make_task(tmp_path, "defined"), tmp_path, pool="warm")
    assert env.pool_name == pool_name_for("warm", env.group_key) != "warm"


async def test_a_missing_generic_pool_is_named_in_the_error(tmp_path: Path) -> None:
    missing = f"absent-{uuid.uuid4().hex[:6]}"
    env = _environment(_undefined_task(tmp_path, "x\n"), tmp_path, pool=missing)
    with pytest.raises(LookupError, match=f"warm pool '{missing}' does not exist: a task with no environment"):
        await env.start(force_build=False)
    await env.stop(delete=True)


async def test_a_registry_build_runs_harbors_own_code_and_fails_as_our_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Harbor's build fails as ``ImageBuildError`` and is retried once; a missing base image
    fails as ``BaseImageMissingError``, naming it, and is built only once."""
    builds: list[str] = []
    harbor_build = environment_images.build_and_push

    async def counting(source: ImageSource, ref: str, logger: logging.Logger) -> None:
        builds.append(source.environment_dir.parent.name)
        await harbor_build(source, ref, logger)

    monkeypatch.setattr(environment_images, "build_and_push", counting)
    failing = f"FROM debian:trixie-slim\nRUN echo broken-{uuid.uuid4().hex[:6]} && exit 3\n"
    env = _environment(make_task(tmp_path, "broken", dockerfile=failing), tmp_path, registry=REGISTRY)
    with pytest.raises(ImageBuildError, match="docker build failed for") as caught:
        await env.prepare_image()
    cause = caught.value.__cause__  # Harbor's build commands failed: a plain RuntimeError, Harbor's words
    assert type(cause) is RuntimeError and str(cause).startswith(f"docker build failed for {env.image_ref}")
    # Ours leads with the failing step and its exit code (Harbor's first line is Docker's
    # legacy-builder notice; a trial's report keeps the first line), then the step's output.
    head, *detail = str(caught.value).splitlines()
    assert head == f"docker build failed for {env.image_ref} at step 2/2 ({failing.splitlines()[1]}), exit code 3"
    assert detail[0] == "--- build output (last lines) ---" and failing.split()[4] in detail
    assert builds == ["broken", "broken"]  # our retry, around one attempt of Harbor's each
    # The legacy builder keeps a failed step's container (Harbor passes no --force-rm): the
    # build printed it, and it is gone afterwards.
    leftovers = re.findall(r"Running in ([0-9a-f]{12,64})", str(cause))
    assert leftovers, "the failing RUN step ran in an intermediate container"
    engine = docker.from_env()
    try:
        for container_id in leftovers:
            with pytest.raises(docker.errors.NotFound):
                engine.containers.get(container_id)
    finally:
        engine.close()

    absent = f"{REGISTRY}/absent-base-{uuid.uuid4().hex[:6]}:1"  # a pull attempt reaches only 127.0.0.1
    env = _environment(make_task(tmp_path, "no-base", dockerfile=f"FROM {absent}\n"), tmp_path, registry=REGISTRY)
    with pytest.raises(BaseImageMissingError, match=f"base image {absent}"):
        await env.prepare_image()
    assert builds.count("no-base") == 1  # a missing base stays missing: not built again


def _harbor_create_keywords() -> dict[bool, set[str]]:
    """The keywords of the two ``sky_sandbox.create.aio`` calls in Harbor's ``_create_sandbox``,
    keyed by whether the call claims from a pool."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(SkypilotEnvironment._create_sandbox)))
    calls: dict[bool, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "aio":
            keywords = {k.arg for k in node.keywords if k.arg is not None}
            calls["pool" in keywords] = keywords
    return calls


class RecordingSdk:
    """The real Docker SDK, with the keywords of every ``create.aio`` call recorded."""

    def __init__(self, sdk: Any) -> None:
        self.sdk = sdk
        self.creates: list[dict[str, Any]] = []
        self.create = SimpleNamespace(aio=self._create)

    async def _create(self, **kwargs: Any) -> Any:
        self.creates.append(kwargs)
        return await self.sdk.create.aio(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sdk, name)


async def test_our_copy_of_create_passes_harbors_keywords(
    tmp_path: Path, generic_pool: str, docker_sandbox_sdk: Any
) -> None:
    """``_create_sandbox`` is a copy of Harbor's with the SDK swapped in: the copy must make the
    same calls (Harbor's own unit tests pin these shapes on a fake SDK)."""
    harbor = _harbor_create_keywords()
    assert harbor[False] >= {"name", "image", "cpus", "memory_gb", "secrets", "timeout", "block_network"}
    assert harbor[True] >= {"name", "pool", "timeout"} and "image" not in harbor[True]
    for task, kwargs in (
        (make_task(tmp_path / "plain", "plain"), {}),
        (_undefined_task(tmp_path / "pooled", "x\n"), {"pool": generic_pool}),
    ):
        env = _environment(task, tmp_path, **kwargs)
        recording = RecordingSdk(docker_sandbox_sdk)
        env.state.sdk = recording  # type: ignore[assignment]
        await env.start(force_build=False)
        await env.stop(delete=True)
        (call,) = recording.creates
        assert set(call) == harbor["pool" in kwargs], f"{sorted(call)} != Harbor's {sorted(harbor['pool' in kwargs])}"
        assert call["timeout"] == 86_400 and call["name"] == env.sandbox_name
