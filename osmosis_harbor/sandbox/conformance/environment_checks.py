"""Checks at the level of our ``SandboxEnvironment``, the Harbor environment every trial uses.

The other checks exercise the raw SDK; these run through our overrides of Harbor's
``SkypilotEnvironment`` on top of the SDK under test: one image per environment *content*,
warm-pool claims through the pool name derived from the environment group, no sandbox left by a
cancellation during create, host networking to a server on 127.0.0.1, the policy relay to one
(for SDKs whose sandboxes run on this machine), and the default bounds.
Tasks use the run's image directly (``docker_image``), so only the image check builds anything.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from pathlib import Path

from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor.sandbox.conformance.core import (
    ConformanceContext,
    check,
    expect,
    poll,
    skip,
)
from osmosis_harbor.sandbox.conformance.limit_checks import BOUNDS_SCRIPT, parse_bounds
from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment
from osmosis_harbor.sandbox.images.builds import remove_local_image
from osmosis_harbor.sandbox.options import IMPORT_PATH
from osmosis_harbor.sandbox.owner.context import owner_scope
from osmosis_harbor.sandbox.owner.pools import pool_keywords, pool_name_for
from osmosis_harbor.sandbox.relay.policy_relay import PolicyRelay
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.liveness import sandbox_state
from osmosis_harbor.sandbox.sdk.registry import implementation, name_of

__all__: list[str] = []

TASK_TOML = 'schema_version = "1.4"\n\n[environment]\n{image}\n[verifier]\ntimeout_sec = 60.0\n'


def _sdk_name(ctx: ConformanceContext) -> str:
    name = name_of(ctx.sdk)
    expect(name is not None, "environment checks need a registered SDK (osmosis_harbor.sandbox.sdk.registry)")
    assert name is not None
    return name


def _task(ctx: ConformanceContext, stem: str, *, dockerfile: str | None = None, defined: bool = True) -> Path:
    """A task directory under a temporary root removed when the run ends; ``defined=False``
    gives it no environment definition (no Dockerfile, no ``docker_image``)."""
    root = Path(tempfile.mkdtemp(prefix=f"{ctx.prefix}-"))

    async def remove() -> None:
        shutil.rmtree(root, ignore_errors=True)

    ctx.on_close(remove)
    task = root / stem
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (task / "instruction.md").write_text("conformance\n")
    image = "" if dockerfile or not defined else f'docker_image = "{ctx.image}"\n'
    (task / "task.toml").write_text(TASK_TOML.format(image=image))
    if dockerfile:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


def _environment(ctx: ConformanceContext, task_dir: Path, **kwargs: object) -> SandboxEnvironment:
    """Our environment for ``task_dir``, made the way a trial makes it (Harbor's factory)."""
    task = Task(task_dir)
    trial_paths = TrialPaths(task_dir.parent / f"trial-{uuid.uuid4().hex[:8]}")
    trial_paths.mkdir()
    config = EnvironmentConfig(import_path=IMPORT_PATH, kwargs={"sdk": _sdk_name(ctx), **kwargs})
    with owner_scope(ctx.owner):  # the run's, whoever runs the check
        env = EnvironmentFactory.create_environment_from_config(
            config,
            environment_dir=task.paths.environment_dir,
            environment_name=task.name,
            session_id=ctx.unique("env"),
            trial_paths=trial_paths,
            task_env_config=task.config.environment,
            network_policy=task.config.environment.resolve_baseline(),
        )
    assert isinstance(env, SandboxEnvironment)

    async def stop() -> None:
        await env.stop(delete=True)

    ctx.on_close(stop)
    return env


@check()
async def check_environment_image_by_content_hash(ctx: ConformanceContext) -> str:
    """Two tasks with the same environment/ share one image, named by its content hash, built once."""
    impl = implementation(_sdk_name(ctx))
    if not impl.local_images and not (ctx.settings.registry or impl.default_registry):
        skip("this SDK pulls images from a registry, and none is set (OSMOSIS_HARBOR_REGISTRY)")
    dockerfile = f"FROM {ctx.image}\nLABEL osmosis-harbor-conformance={ctx.prefix}\n"
    first = _environment(ctx, _task(ctx, "first", dockerfile=dockerfile))
    second = _environment(ctx, _task(ctx, "second", dockerfile=dockerfile))
    expect(first.image_ref == second.image_ref, f"{first.image_ref} != {second.image_ref}")
    expect(first.environment_id in first.image_ref, f"{first.image_ref} does not name {first.environment_id}")

    async def forget() -> None:
        ctx.owner.builds.forget(first.image_ref)
        if impl.local_images and not ctx.settings.registry:
            await asyncio.to_thread(remove_local_image, first.image_ref)

    ctx.on_close(forget)
    ref, built = await first.prepare_image()
    again, rebuilt = await second.prepare_image()
    expect(built and not rebuilt and ref == again, f"built {built}, then built again {rebuilt}")
    return ref or ""


@check(pools=True)
async def check_environment_claims_its_group_pool(ctx: ConformanceContext) -> str:
    """A pool base name claims from the pool derived from the environment group."""
    env = _environment(ctx, _task(ctx, "pooled"), pool=f"{ctx.prefix}-pool")
    expect(env.pool_name == pool_name_for(f"{ctx.prefix}-pool", env.group_key), f"pool name {env.pool_name}")
    assert env.pool_name is not None
    await ctx.track_pool(env.pool_name)
    keywords = pool_keywords(ctx.sdk, env.pool_name, env.pool_shape())
    await ctx.sdk.create_pool.aio(env.pool_name, ctx.image, replicas=1, **keywords)
    await env.start(force_build=False)
    out = await env.exec("echo claimed")
    expect(out.return_code == 0 and (out.stdout or "").strip() == "claimed", f"exec in the claimed sandbox: {out}")
    listed = [records.pool_of(r) for r in await ctx.sdk.ls.aio() if records.name_of(r) == env.sandbox_name]
    expect(listed == [env.pool_name], f"ls() lists {env.sandbox_name} with pool {listed}, not {env.pool_name}")
    return env.pool_name


@check(pools=True)
async def check_environment_runs_undefined_task_from_a_generic_pool(ctx: ConformanceContext) -> str:
    """A task with no environment definition runs from a named pool, as in Harbor: the pool is
    claimed by its own name and the task's environment/ is uploaded into the sandbox."""
    task = _task(ctx, "generic", defined=False)
    marker = f"{ctx.prefix}-generic\n"
    (task / "environment" / "marker.txt").write_text(marker)
    pool = ctx.unique("generic")
    env = _environment(ctx, task, pool=pool)
    expect(env.pool_name == pool, f"claims from {env.pool_name!r}, not the named pool {pool!r}")
    await ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    await env.start(force_build=False)
    out = await env.exec("cat marker.txt")
    expect(out.return_code == 0 and out.stdout == marker, f"environment/ not uploaded: {out}")
    return pool


@check()
async def check_environment_cancelled_during_create_leaves_nothing(ctx: ConformanceContext) -> str:
    """Cancelling a trial's start while its sandbox is being created leaves no sandbox behind."""
    env = _environment(ctx, _task(ctx, "cancelled"))
    starting = asyncio.ensure_future(env.start(force_build=False))

    async def creating() -> bool:
        return ctx.owner.sandboxes.registered(env.sandbox_name) or starting.done()

    await poll(creating, timeout=60, what="the sandbox create to begin")
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)

    async def gone() -> bool:
        return (await sandbox_state(ctx.sdk, env.sandbox_name)).status is None

    await poll(gone, timeout=60, what=f"sandbox {env.sandbox_name} to be gone after the cancellation")
    expect(not ctx.owner.sandboxes.registered(env.sandbox_name), "the cancelled sandbox is still registered as live")
    return env.sandbox_name


@check(needs=("reaches_host",))
async def check_environment_host_network_reaches_loopback(ctx: ConformanceContext) -> str:
    """With host networking, a sandbox reaches a server on this machine's 127.0.0.1."""

    async def greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"{ctx.prefix}\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        env = _environment(ctx, _task(ctx, "hostnet"), host_network=True)
        await env.start(force_build=False)
        out = await env.exec(f"exec 3<>/dev/tcp/127.0.0.1/{port} && head -n 1 <&3", timeout_sec=30)
        expect(
            (out.stdout or "").strip() == ctx.prefix, f"read {out.stdout!r} (exit {out.return_code}, {out.stderr!r})"
        )
    finally:
        server.close()
        await server.wait_closed()
    return f"127.0.0.1:{port}"


@check()
async def check_environment_relay_reaches_loopback_endpoint(ctx: ConformanceContext) -> str:
    """Through the policy relay, a sandbox reaches an endpoint on this machine's 127.0.0.1
    (under its path, with its token), and does not reach it directly."""
    if not implementation(_sdk_name(ctx)).relays_host_endpoint:
        return "not applicable: this SDK's sandboxes reach public endpoints only"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = ctx.prefix.encode()
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    relay = PolicyRelay(config=ctx.settings)
    try:
        route = await relay.register(f"http://127.0.0.1:{port}/v1")
        assert relay.address is not None
        host, relay_port = relay.address
        env = _environment(ctx, _task(ctx, "relay"))
        await env.start(force_build=False)
        request = f"GET /{route.token}/v1/models HTTP/1.0\\r\\n\\r\\n"
        out = await env.exec(
            f"exec 3<>/dev/tcp/{host}/{relay_port} && printf '{request}' >&3 && cat <&3", timeout_sec=30
        )
        expect(ctx.prefix in (out.stdout or ""), f"read {out.stdout!r} (exit {out.return_code}, {out.stderr!r})")
        direct = await env.exec(f"timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'", timeout_sec=30)
        expect(direct.return_code != 0, "the sandbox reached the endpoint on 127.0.0.1 without the relay")
    finally:
        await relay.aclose()
        server.close()
        await server.wait_closed()
    return f"127.0.0.1:{port} via {host}:{relay_port}"


@check()
async def check_environment_default_bounds(ctx: ConformanceContext) -> str:
    """A task that names no resources gets Harbor's documented sizing: 1 CPU, 2048 MB."""
    env = _environment(ctx, _task(ctx, "bounds"))
    await env.start(force_build=False)
    out = await env.exec(BOUNDS_SCRIPT)
    expect(out.return_code == 0, f"reading the bounds failed: {out.stderr!r}")
    bounds = parse_bounds(out.stdout or "")
    expect(bounds.memory_bytes == 2048 * 1024 * 1024, f"memory {bounds.memory_bytes}")
    expect(bounds.cpus == 1.0, f"cpus {bounds.cpus}")
    return bounds.describe()
