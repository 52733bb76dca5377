"""Our claims survive SkyPilot's pools (``sandbox/owner/pools.py``, ``batching.py``), on the strict
emulator: a claim its pool cannot serve waits a bounded time, then cold-creates the pool's image
(counted as a fallback), never a lost start; a warming pool serves within the wait; a batch the
pool cannot serve whole is split; a batch call that faulted after making members leaves none; a
task with no environment definition gets a clear error instead. Real environments (Harbor's
``SkypilotEnvironment`` path) on a real emulator server; nothing faked but one injected fault."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor import settings
from osmosis_harbor.errors import PoolClaimError
from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
from osmosis_harbor.sandbox import emulator as sky
from osmosis_harbor.sandbox.emulator.client import extensions
from osmosis_harbor.sandbox.environment.grouping import pool_refusal
from osmosis_harbor.sandbox.ledger.store import default_ledger
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from osmosis_harbor.sandbox.owner.pools import pool_name_for
from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.registry import load_sandbox_sdk
from tests.support.common import make_task, wait_until
from tests.support.emulator import EmulatorServer, private_emulator, push_to_local_registry

SDK = "skypilot-emulator"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    with private_emulator(tmp_path_factory.mktemp("emulator-claims")) as server:
        yield server


@pytest.fixture(scope="module")
def image(sandbox_image: str) -> str:
    return push_to_local_registry(sandbox_image)


@pytest.fixture(autouse=True)
def _fresh(emulator: EmulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator.reset()
    monkeypatch.setenv("OSMOSIS_HARBOR_LEDGER", str(tmp_path / "ledger.sqlite3"))
    monkeypatch.setenv("OSMOSIS_HARBOR_API_RETRY_MAX_WAIT", "0.2")


def _task(root: Path, image: str, *, defined: bool = True) -> Path:
    """A task on the prebuilt ``image``, or (``defined=False``) one with no environment definition."""
    toml = f'docker_image = "{image}"\n' if defined else ""
    task_dir = make_task(root / f"tasks-{uuid.uuid4().hex[:6]}", "claims", toml_extra=toml)
    if not defined:
        (task_dir / "environment" / "Dockerfile").unlink()
    return task_dir


def _environment(root: Path, task_dir: Path, pool: str, sdk: str = SDK) -> SandboxEnvironment:
    """A trial of ``task_dir`` claiming from ``pool``: its group's pool for a defined task, the
    named generic pool for one with no environment definition."""
    task = Task(task_dir)
    trial_paths = TrialPaths(root / f"trial-{uuid.uuid4().hex[:6]}")
    trial_paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        environment_config(sdk, pool=pool),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"claims-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
        network_policy=task.config.environment.resolve_baseline(),  # what a trial passes
    )
    assert isinstance(env, SandboxEnvironment)
    return env


def _record(name: str) -> Any:
    return next((r for r in sky.ls() if records.name_of(r) == name), None)


async def _group_pool(sandboxes: OwnedSandboxes, env: SandboxEnvironment, image: str, size: int) -> str | None:
    assert env.pool_name is not None
    return await pools.create(sandboxes, SDK, env.pool_name, image, size, env.pool_shape())


async def test_an_empty_pool_claim_waits_then_cold_creates_the_pools_image(
    image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_CLAIM_WAIT_SEC", "1")
    starts = SandboxStarts(4)
    owner = SandboxOwner.make("test", config=settings.current(), starts=starts)
    sandboxes = owner.sandboxes
    base = f"claims{uuid.uuid4().hex[:6]}"
    with owner_scope(owner):
        task = _task(tmp_path, image)
        env = _environment(tmp_path, task, base)
        assert await _group_pool(sandboxes, env, image, 0) is None
        try:
            started = time.monotonic()
            await env.start(force_build=False)
            waited = time.monotonic() - started
            try:
                out = await env.exec("echo ran")
                assert out.return_code == 0 and (out.stdout or "").strip() == "ran"
                record = _record(env.sandbox_name)
                assert record is not None and records.pool_of(record) is None  # a cold create...
                assert record._record["image"] == image  # ...of the pool's image
                assert starts.fallbacks == {env.pool_name: 1} and starts.state()["pool_fallbacks"] == 1
                assert waited >= 1.0  # it waited for a member first (a lower bound)
            finally:
                await env.stop(delete=True)
            # Positive control: with a ready member the same claim is served by the pool.
            await pools.create(sandboxes, SDK, env.pool_name or "", image, 1, env.pool_shape())  # adopted, resized
            served = _environment(tmp_path, task, base)
            await served.start(force_build=False)
            try:
                assert records.pool_of(_record(served.sandbox_name)) == served.pool_name
                assert starts.state()["pool_fallbacks"] == 1
            finally:
                await served.stop(delete=True)
        finally:
            assert await pools.delete(sandboxes, SDK, [env.pool_name or ""]) == []
    assert default_ledger(settings.current()).entries() == []


async def test_a_warming_pool_is_usable_and_serves_within_the_wait(
    emulator: EmulatorServer, image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator.knobs(pool_warm_sec=10, pool_warm_timeout_sec=0)  # create_pool returns long before it is warm
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_CLAIM_WAIT_SEC", "30")
    starts = SandboxStarts(4)
    owner = SandboxOwner.make("test", config=settings.current(), starts=starts)
    sandboxes = owner.sandboxes
    with owner_scope(owner):
        env = _environment(tmp_path, _task(tmp_path, image), f"warming{uuid.uuid4().hex[:6]}")
        note = await _group_pool(sandboxes, env, image, 1)
        assert note is not None and note.startswith("adopted, still warming") and "last seen 0/1" in note
        try:
            await env.start(force_build=False)
            try:
                assert records.pool_of(_record(env.sandbox_name)) == env.pool_name  # the pool's member
                assert starts.state()["pool_fallbacks"] == 0
            finally:
                await env.stop(delete=True)
        finally:
            assert await pools.delete(sandboxes, SDK, [env.pool_name or ""]) == []


async def test_a_batch_the_pool_cannot_serve_whole_is_split(
    image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_CLAIM_WAIT_SEC", "0")
    starts = SandboxStarts(8, batch_window_sec=60, batch_max=4)
    owner = SandboxOwner.make("test", config=settings.current(), starts=starts)
    sandboxes = owner.sandboxes  # the batch closes when four joined
    base = f"split{uuid.uuid4().hex[:6]}"
    with owner_scope(owner):
        task = _task(tmp_path, image)
        envs = [_environment(tmp_path, task, base) for _ in range(4)]
        pool = envs[0].pool_name or ""
        await _group_pool(sandboxes, envs[0], image, 2)
        try:
            await asyncio.gather(*(env.start(force_build=False) for env in envs))
            try:
                from_pool = [env for env in envs if records.pool_of(_record(env.sandbox_name)) == pool]
                assert len(from_pool) == 2 and starts.fallbacks == {pool: 2}
                assert starts.batches is not None and starts.batches.calls == 3  # 4, then 2 and 2
                outs = await asyncio.gather(*(env.exec("true") for env in envs))
                assert all(out.return_code == 0 for out in outs)
            finally:
                await asyncio.gather(*(env.stop(delete=True) for env in envs))
        finally:
            assert await pools.delete(sandboxes, SDK, [pool]) == []


class _FaultAfterBatch:
    """The real emulator SDK, except that the first batch claim's answer is lost after the
    server made its members (a reset after the work): what ``create_checked`` cannot see by name."""

    def __init__(self) -> None:
        self.prefixes: list[str] = []
        self.create = _Call(self._create)

    async def _create(self, **kwargs: Any) -> Any:
        made = await sky.create.aio(**kwargs)
        if kwargs.get("num_sandboxes") and not self.prefixes:
            self.prefixes.append(kwargs["name"])
            raise sky.ApiConnectionError("connection reset after the server answered")
        return made

    def __getattr__(self, name: str) -> Any:
        return getattr(sky, name)


class _Call:
    def __init__(self, aio: Any) -> None:
        self.aio = aio


async def test_a_batch_call_that_faulted_after_making_members_leaves_none(
    image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_CLAIM_WAIT_SEC", "10")
    # The window only has to hold both first starts of one gather together (a few seconds under
    # load); a retry that finds no companion waits it out, which took 60 s in a loaded full run.
    starts = SandboxStarts(8, batch_window_sec=20, batch_max=2)
    owner = SandboxOwner.make("test", config=settings.current(), starts=starts)
    sandboxes = owner.sandboxes
    faulty = _FaultAfterBatch()
    with owner_scope(owner):
        task, base = _task(tmp_path, image), f"fault{uuid.uuid4().hex[:6]}"
        envs = [_environment(tmp_path, task, base) for _ in range(2)]
        pool = envs[0].pool_name or ""
        await _group_pool(sandboxes, envs[0], image, 2)
        for env in envs:
            env.state.sdk = faulty  # type: ignore[assignment]
        try:
            await asyncio.gather(*(env.start(force_build=False) for env in envs))
            try:
                (prefix,) = faulty.prefixes
                assert not [r for r in sky.ls() if (records.name_of(r) or "").startswith(f"{prefix}-")]
                outs = await asyncio.gather(*(env.exec("true") for env in envs))
                assert all(out.return_code == 0 for out in outs)
            finally:
                await asyncio.gather(*(env.stop(delete=True) for env in envs))
        finally:
            assert await pools.delete(sandboxes, SDK, [pool]) == []
    assert default_ledger(settings.current()).entries() == []


async def test_a_generic_pool_with_no_member_is_a_clear_error_and_leaves_nothing(
    image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_CLAIM_WAIT_SEC", "0.5")
    pool = f"generic{uuid.uuid4().hex[:6]}"
    sky.create_pool(pool, image, replicas=0)
    try:
        task = _task(tmp_path, image, defined=False)
        with owner_scope(SandboxOwner.make("test", config=settings.current())):
            env = _environment(tmp_path, task, pool)
            assert env.pool_name == pool  # claimed by its own name
            with pytest.raises(
                PoolClaimError, match=f"warm pool '{pool}' could not serve a claim.*make the pool larger"
            ):
                await env.start(force_build=False)
        assert _record(env.sandbox_name) is None and default_ledger(settings.current()).entries() == []
        sky.set_pool_size(pool, 1)  # positive control: with a member, the same task runs
        wait_until(lambda: extensions.get_pool(pool).idle == 1, timeout=60, what="a member")
        with owner_scope(SandboxOwner.make("test", config=settings.current())):
            env = _environment(tmp_path, task, pool)
            await env.start(force_build=False)
            await env.stop(delete=True)
    finally:
        sky.delete_pool(pool)


def test_block_network_goes_to_create_pool_only_where_its_signature_has_it() -> None:
    from osmosis_harbor.errors import ConfigError
    from osmosis_harbor.sandbox import docker as docker_sdk

    shape = {"cpus": 1.0, "memory_gb": 2.0, "block_network": False}
    assert pools.pool_keywords(sky, "p", shape) == {"cpus": 1.0, "memory_gb": 2.0}  # nothing to ask: not sent
    blocked = {**shape, "block_network": True}
    assert pools.pool_keywords(docker_sdk, "p", blocked)["block_network"] is True  # the Docker SDK takes it
    with pytest.raises(ConfigError, match="create_pool takes no block_network=.*without a pool"):
        pools.pool_keywords(sky, "p", blocked)  # SkyPilot's documented signature has no network option

    class KeywordsOnly:  # a signature that does not name it: not sent either
        def create_pool(self, name: str, image: str, **kwargs: Any) -> None: ...

    with pytest.raises(ConfigError):
        pools.pool_keywords(KeywordsOnly(), "p", blocked)  # type: ignore[arg-type]


@pytest.mark.parametrize("sdk", ["docker", SDK])
def test_a_task_without_a_network_claims_no_pool_where_pools_cannot_hold_it(sdk: str, tmp_path: Path) -> None:
    """SkyPilot's create_pool has no network option: where an SDK's pools cannot hold a sandbox
    without a network, a trial of such a task claims no pool (it is created cold, with its own
    block_network), and says why; where they can (the Docker SDK's), it claims its group's pool.
    A task with a network claims its group's pool on both."""
    root = tmp_path / "tasks"
    offline = make_task(root, "offline", toml_extra='network_mode = "no-network"\n')
    online = make_task(root, "online")
    cold = _environment(tmp_path, offline, "warm", sdk)
    warm = _environment(tmp_path, online, "warm", sdk)
    assert cold.pool_shape()["block_network"] is True and warm.pool_shape()["block_network"] is False
    assert warm.pool_name == pool_name_for("warm", warm.group_key)
    refusal = pool_refusal(SandboxOptions.of(environment_config(sdk, pool="warm")), no_network=True)
    assert pool_refusal(SandboxOptions.of(environment_config(sdk, pool="warm")), no_network=False) is None
    assert pool_refusal(SandboxOptions.of(environment_config(sdk)), no_network=True) is None  # no pool named
    if sdk == "docker":
        assert cold.pool_name == pool_name_for("warm", cold.group_key) and refusal is None
    else:
        assert cold.pool_name is None
        assert refusal == (
            "runs cold, not from warm pool 'warm': on skypilot-emulator, create_pool takes no block_network=, "
            "so a member would have a network and this task must have none"
        )


@pytest.mark.parametrize("sdk", ["docker", SDK])
async def test_a_task_with_a_dockerfile_claims_from_a_named_generic_pool_as_harbor_does(
    sdk: str, image: str, sandbox_image: str, tmp_path: Path
) -> None:
    """``pool=`` naming an existing generic pool, for a task with an environment definition and no
    group pool prewarmed: claimed from that pool, with ``environment/`` uploaded (Harbor's
    ``SkypilotEnvironment`` behaviour). Without the pool, the error names both pools."""
    module = load_sandbox_sdk(sdk)
    image = image if sdk == SDK else sandbox_image  # the engine's own image needs no registry
    pool = f"generic{uuid.uuid4().hex[:6]}"
    task = _task(tmp_path, image)
    (task / "environment" / "payload.txt").write_text("from the task\n")

    def record(name: str) -> Any:
        return next((r for r in module.ls() if records.name_of(r) == name), None)

    with owner_scope(SandboxOwner.make("test", config=settings.current())):
        env = _environment(tmp_path, task, pool, sdk)
        group = env.pool_name
        assert group is not None and group != pool  # a defined task asks for its group's pool first
        with pytest.raises(LookupError, match=f"{group}.*nor does a pool named '{pool}'.*prewarm"):
            await env.start(force_build=False)  # control: neither pool exists
        assert record(env.sandbox_name) is None
    module.create_pool(pool, image, replicas=1)
    try:
        if sdk == SDK:
            wait_until(lambda: extensions.get_pool(pool).idle == 1, timeout=60, what="a member")
        with owner_scope(SandboxOwner.make("test", config=settings.current())):
            env = _environment(tmp_path, task, pool, sdk)
            await env.start(force_build=False)
            try:
                assert records.pool_of(record(env.sandbox_name)) == pool  # the named pool's member
                assert env.pool_name == pool
                out = await env.exec("cat payload.txt")
                assert (out.stdout or "").strip() == "from the task"  # environment/ was uploaded
            finally:
                await env.stop(delete=True)
    finally:
        module.delete_pool(pool)
    assert default_ledger(settings.current()).entries() == []
