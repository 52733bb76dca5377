"""Our Harbor environment (SkyPilot's behaviour where we keep it) over our Docker ``sky.sandbox``
implementation: exec wrapping, users, env, file and directory transfer, images and the
registry path, and the errors a user sees when the SkyPilot SDK is missing."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import docker
import pytest
from harbor.environments.base import BaseEnvironment
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor import settings
from osmosis_harbor.sandbox import SandboxEnvironment, SandboxSdkMissingError, environment_config, load_sandbox_sdk
from osmosis_harbor.sandbox.environment.images import manifest_exists
from osmosis_harbor.sandbox.images.builds import registry_image_exists
from osmosis_harbor.sandbox.sdk.liveness import SandboxLostError
from tests.support.common import make_task, managed_containers, wait_until

REGISTRY = "127.0.0.1:5000"


def _environment(task_dir: Path, tmp_path: Path, **kwargs) -> SandboxEnvironment:
    task = Task(task_dir)
    trial_paths = TrialPaths(tmp_path / f"trial-{uuid.uuid4().hex[:6]}")
    trial_paths.mkdir()
    config = environment_config("docker", **kwargs)
    env = EnvironmentFactory.create_environment_from_config(
        config,
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"envtest-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
    )
    assert isinstance(env, SandboxEnvironment) and isinstance(env, BaseEnvironment)
    return env


async def test_harbor_environment_api_over_docker_sandbox(tmp_path: Path) -> None:
    task = make_task(
        tmp_path / "ds",
        "env-api",
        dockerfile=(
            "FROM debian:trixie-slim\nRUN useradd -m agent && mkdir /work && chown agent /work\nWORKDIR /work\n"
        ),
    )
    env = _environment(task, tmp_path)
    await env.start(force_build=False)
    try:
        assert [c for c in managed_containers() if env.sandbox_name in c["Names"][0]]
        result = await env.exec("pwd; echo $FOO; echo err >&2; exit 7", env={"FOO": "bar"})
        assert (result.return_code, result.stdout, result.stderr) == (7, "/work\nbar\n", "err\n")
        assert (await env.exec("whoami", user="agent")).stdout == "agent\n"
        assert (await env.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
        assert (await env.exec("echo ${FOO:-unset}")).stdout == "unset\n"  # exec env not persisted
        timed_out = await env.exec("sleep 30", timeout_sec=1)
        assert timed_out.return_code != 0
        src = tmp_path / "payload"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "data.bin").write_bytes(bytes(range(256)) * 100)
        (src / "script.sh").write_text("#!/bin/sh\necho hi\n")
        (src / "script.sh").chmod(0o755)
        await env.upload_dir(src, "/work/payload")
        assert (await env.exec("/work/payload/script.sh")).stdout == "hi\n"
        await env.download_dir("/work/payload", tmp_path / "back")
        assert (tmp_path / "back" / "sub" / "data.bin").read_bytes() == bytes(range(256)) * 100
        await env.upload_file(src / "sub" / "data.bin", "/work/single.bin")
        await env.download_file("/work/single.bin", tmp_path / "single.bin")
        assert (tmp_path / "single.bin").read_bytes() == bytes(range(256)) * 100
    finally:
        await env.stop(delete=True)
    assert not [c for c in managed_containers() if env.sandbox_name in c["Names"][0]]


async def test_registry_path_builds_pushes_once_and_then_reuses(tmp_path: Path) -> None:
    task = make_task(tmp_path / "ds", "registry-task")
    env = _environment(task, tmp_path, registry=REGISTRY)
    ref = env.image_ref
    assert ref.startswith(f"{REGISTRY}/") and ref.endswith(env.environment_id)
    # Harbor's own check (docker manifest inspect without --insecure) cannot see a plain
    # http registry; that is the bug we fix. Ours answers from the engine.
    assert not registry_image_exists(ref)
    # made outside any owner, the environment owns itself: its own builds, none known before
    await asyncio.gather(*(env.prepare_image(force_build=False) for _ in range(4)))
    assert env.owner.builds.stats.built == [ref]
    assert registry_image_exists(ref)
    assert not await manifest_exists(ref)  # Harbor's check (its CLI command) still says "missing"

    docker.from_env().images.remove(ref, force=True)  # only the registry has it now
    second = _environment(task, tmp_path, registry=REGISTRY)  # a new owner: nothing known locally
    await second.start(force_build=False)
    fresh = second.owner.builds.stats
    try:
        assert fresh.built == [] and fresh.reused == [ref]
        assert (await second.exec("cat /marker")).return_code == 0
    finally:
        await second.stop(delete=True)


def test_missing_skypilot_sdk_error_says_what_to_install() -> None:
    with pytest.raises(SandboxSdkMissingError) as info:
        load_sandbox_sdk("skypilot")
    assert "SkyPilot Platform installer" in str(info.value) and "sky api login" in str(info.value)
    with pytest.raises(SandboxSdkMissingError):
        environment_config("skypilot")


def test_environment_config_rejects_bad_choices() -> None:
    with pytest.raises(ValueError, match="unknown sandbox sdk"):
        environment_config("kubernetes")
    with pytest.raises(ValueError, match="host_network"):
        environment_config("skypilot", host_network=True)
    config = environment_config("docker", host_network=True, registry=REGISTRY, pool="p")
    assert config.import_path == "osmosis_harbor.sandbox.environment:SandboxEnvironment"
    assert config.kwargs == {"sdk": "docker", "host_network": True, "registry": REGISTRY, "pool": "p"}


def test_a_task_without_resources_gets_harbors_documented_sizing(tmp_path: Path) -> None:
    """What every SDK is asked for (SkyPilot included), not only what Docker applies itself."""
    bare = _environment(make_task(tmp_path / "ds", "bare"), tmp_path)
    assert (bare._effective_cpus, bare._effective_memory_mb) == (1, 2048)
    sized = _environment(make_task(tmp_path / "ds", "sized", toml_extra="cpus = 2\nmemory_mb = 1024\n"), tmp_path)
    assert (sized._effective_cpus, sized._effective_memory_mb) == (2, 1024)


async def test_a_lost_sandbox_is_told_from_a_failing_command(tmp_path: Path) -> None:
    env = _environment(make_task(tmp_path / "ds", "lost"), tmp_path)
    await env.start(force_build=False)
    try:
        own = await env.exec("kill -9 $$")  # exit 137 from a sandbox that still runs: an ordinary result
        assert own.return_code == 137
        (container,) = [c for c in managed_containers() if env.sandbox_name in c["Names"][0]]
        running = asyncio.ensure_future(env.exec("sleep 120"))
        await asyncio.to_thread(
            wait_until, lambda: _runs(container["Id"], "sleep 120"), timeout=30, what="the command to start"
        )
        docker.from_env().api.kill(container["Id"])  # the infrastructure, not this trial
        with pytest.raises(SandboxLostError, match=f"sandbox {env.sandbox_name} was lost") as lost:
            await running
        assert "by the infrastructure" in str(lost.value)
        with pytest.raises(SandboxLostError):  # known lost: every later call fails the same way
            await env.download_file("/etc/hostname", tmp_path / "hostname")
    finally:
        await env.stop(delete=True)


async def test_a_sandbox_this_trial_stopped_is_not_lost(tmp_path: Path) -> None:
    env = _environment(make_task(tmp_path / "ds", "stopped"), tmp_path)
    await env.start(force_build=False)
    await env.stop(delete=True)
    with pytest.raises(RuntimeError, match="Sandbox not found. Please start the environment first") as info:
        await env.exec("true")  # Harbor's own refusal of a stopped environment
    assert not isinstance(info.value, SandboxLostError)


def _runs(container_id: str, command: str) -> bool:
    return command in str(docker.from_env().api.top(container_id)["Processes"])


async def test_stop_inside_a_termination_scope_leaves_the_wait_to_settle(tmp_path: Path) -> None:
    """Made inside a trial's scope (its trial context), a stop hands terminate(wait=True) to a
    task (the trial goes on); the sandbox stays registered until ``settle`` has seen it gone.
    Made outside a trial's scope, the stop itself waits."""
    from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope, settle, trial_scope

    task = make_task(tmp_path / "ds", "defer", dockerfile="FROM debian:trixie-slim\n")
    owner = SandboxOwner.make("test", config=settings.current())
    with owner_scope(owner):
        with trial_scope() as trial:
            deferred = _environment(task, tmp_path)
        inline = _environment(task, tmp_path)
        await deferred.start(force_build=False)
        await inline.start(force_build=False)
        await deferred.stop(delete=True)
        pending = trial.terminations
        assert len(pending) == 1 and owner.sandboxes.registered(deferred.sandbox_name)
        await settle(pending)
        assert not pending and not owner.sandboxes.registered(deferred.sandbox_name)
        await inline.stop(delete=True)
        assert not owner.sandboxes.registered(inline.sandbox_name)
    names = [c["Names"][0] for c in managed_containers()]
    assert not [n for n in names if deferred.sandbox_name in n or inline.sandbox_name in n]
