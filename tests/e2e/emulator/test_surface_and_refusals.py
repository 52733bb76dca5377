"""The skypilot-emulator's documented ``sky.sandbox`` surface, and SkyPilot's refusals.

A real server process (``python -m osmosis_harbor emulator``) on an ephemeral loopback port,
sandboxes on the real Docker engine, images pulled from the local registry."""

from __future__ import annotations

import contextlib
import time
import uuid

import docker
import docker.errors
import pytest

from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox import emulator as sky
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker.labels import Role
from osmosis_harbor.sandbox.emulator.client import extensions
from osmosis_harbor.sandbox.emulator.server.state import check_exec_timeout
from osmosis_harbor.sandbox.sdk.protocol import has_archives
from tests.support.emulator import (
    EmulatorServer,
    emulator_env,
    private_emulator,
)


def _name(stem: str) -> str:
    return f"emu-{stem}-{uuid.uuid4().hex[:6]}"


def test_exec_env_output_and_files(image: str) -> None:
    with sky.create(name=_name("surface"), image=image, env={"A": "create"}, timeout=600) as sb:
        handle = sb.exec("sh", "-c", 'echo "$A $B"; echo oops >&2; exit 3', env={"A": "exec", "B": "b"})
        assert handle.wait() == 3
        assert handle.stdout.read() == "exec b\n"
        assert handle.stderr.read() == "oops\n"
        again = sb.exec("sh", "-c", 'echo "$A ${B:-unset}"')
        assert again.wait() == 0 and again.stdout.read() == "create unset\n"  # per-exec env not persisted
        literal = sb.exec("echo", "$A", "a b")  # argv tokens, no implicit shell
        assert literal.wait() == 0 and literal.stdout.read() == "$A a b\n"
        payload = bytes(range(256)) * 1000
        assert sb.exec("mkdir", "-p", "/work/deep/dir").wait() == 0  # a write makes no directory
        sb.write_bytes(payload, "/work/deep/dir/blob.bin")
        assert sb.read_bytes("/work/deep/dir/blob.bin") == payload
        with pytest.raises(sky.RemoteFileNotFoundError):
            sb.read_bytes("/work/missing")
        with pytest.raises(sky.RemoteIsADirectoryError):
            sb.read_bytes("/work/deep")
        listed = {r.name: r for r in sky.ls()}
        assert listed[sb.name].status == "RUNNING" and listed[sb.name].image == image
    assert sb.name not in {r.name for r in sky.ls()}
    sb.terminate()  # idempotent
    with pytest.raises(sky.SandboxNotFoundError):
        sb.exec("true")


async def test_aio_twins_and_num_sandboxes(image: str) -> None:
    prefix = _name("many")
    made = await sky.create.aio(name=prefix, image=image, num_sandboxes=2, timeout=600)
    try:
        assert [sb.name for sb in made] == [f"{prefix}-0001", f"{prefix}-0002"]
        handle = await made[0].exec.aio("sh", "-c", "printf %s $((6*7))", workdir="/tmp", timeout_seconds=30)
        assert await handle.wait() == 0 and handle.stdout.read() == "42"
        await made[1].write_bytes.aio(b"x", "/tmp/x")
        assert await made[1].read_bytes.aio("/tmp/x") == b"x"
        assert {sb.name for sb in made} <= {r.name for r in await sky.ls.aio()}
    finally:
        for sb in made:
            await sb.terminate.aio(wait=True)
    await sky.aclose.aio()  # releases the session; the next call opens another
    assert not {sb.name for sb in made} & {r.name for r in sky.ls()}


def test_exec_timeout_is_enforced_in_the_sandbox(image: str) -> None:
    assert check_exec_timeout(None) == 60  # SkyPilot's default when timeout_seconds is not given
    with sky.create(name=_name("timeout"), image=image, timeout=600) as sb:
        handle = sb.exec("sh", "-c", "sleep 300 & echo $! > /tmp/child; wait", timeout_seconds=1)
        assert handle.wait() == 124
        # killed in the pod, not just abandoned by the client: the background child is gone too
        probe = sb.exec("sh", "-c", 'kill -0 "$(cat /tmp/child)" 2>/dev/null && echo alive || echo gone')
        assert probe.wait() == 0 and probe.stdout.read() == "gone\n"
        with pytest.raises(sky.InvalidRequestError, match="3600"):
            sb.exec("true", timeout_seconds=3601)
        assert sb.exec("true", timeout_seconds=3600).wait() == 0  # the cap itself is allowed


@pytest.mark.parametrize("bad", ["Upper", "under_score", "-lead", "trail-", "x" * 54])
def test_names_must_be_dns_1123_of_at_most_53(image: str, bad: str) -> None:
    with pytest.raises(sky.InvalidRequestError, match="DNS-1123|53") as caught:
        sky.create(name=bad, image=image, timeout=60)
    assert isinstance(caught.value, RuntimeError) and caught.value.status_code == 400
    assert bad not in {r.name for r in sky.ls()}


def test_images_only_by_registry_reference(image: str, sandbox_image: str) -> None:
    with pytest.raises(sky.ImagePullError, match="not a registry reference"):
        sky.create(name=_name("bare"), image=sandbox_image, timeout=60)
    # built (tagged) on this very engine but never pushed: SkyPilot's nodes could not pull it
    never_pushed = f"127.0.0.1:5000/emu-never-pushed:{uuid.uuid4().hex[:8]}"
    client = docker.from_env()
    repository, tag = never_pushed.rsplit(":", 1)
    client.images.get(sandbox_image).tag(repository, tag)
    try:
        with pytest.raises(sky.ImagePullError, match="ErrImagePull"):
            sky.create(name=_name("unpushed"), image=never_pushed, timeout=60)
        push_to_local_registry_ref(client, repository, tag)  # positive control: once pushed, it runs
        with sky.create(name=_name("pushed"), image=never_pushed, timeout=60) as sb:
            assert sb.exec("true").wait() == 0
    finally:
        client.images.remove(never_pushed, force=True)


def push_to_local_registry_ref(client: docker.DockerClient, repository: str, tag: str) -> None:
    for line in client.api.push(repository, tag=tag, stream=True, decode=True):
        assert "error" not in line, line


def test_skypilot_limits_not_docker_capabilities(image: str) -> None:
    with pytest.raises(TypeError):
        sky.create(name=_name("hostnet"), image=image, host_network=True)  # type: ignore[call-arg]
    with pytest.raises(sky.NotSupportedError):
        sky.create(name=_name("ports"), image=image, ports=[8080])
    with sky.create(name=_name("caps"), image=image, timeout=600) as sb:
        assert not has_archives(sb)
        assert not hasattr(sb, "put_archive") and not hasattr(sb, "get_archive")


def test_ttl_is_reaped_server_side(image: str) -> None:
    sb = sky.create(name=_name("ttl"), image=image, timeout=2)
    container = docker.from_env().containers.get(sb.name)
    container.wait(timeout=60)  # the engine reports the end of the sandbox's lifetime
    assert sb.name not in {r.name for r in sky.ls()}
    with pytest.raises(sky.SandboxNotFoundError):
        sb.exec("true")


def test_the_ttl_reaper_removes_only_its_own_accounts_sandboxes(emulator: EmulatorServer, image: str) -> None:
    """A Docker SDK sandbox past its TTL on the same engine is not the emulator's to remove (it
    once reaped every expired container on the engine, another user's included)."""
    name = _name("foreign-expired")
    labels = L.container_labels(
        sandbox=name,
        role=Role.SANDBOX,
        owner=OwnerProcess.current(),
        created_at=time.time() - 100,
        ttl_sec=10,
        network="bridge",
    )
    engine = docker_sdk.get_engine()
    with docker_sdk.pause_auto_reap():
        container_id = engine.create_container(
            name=name, image=image, cpus=None, memory_gb=None, network="bridge", ttl_sec=300, labels=labels
        )
        engine.start_container(container_id)
        try:
            assert emulator.admin("POST", "/reap") == {"reaped": 0}
            assert docker.from_env().containers.get(container_id).status == "running"
            # Control: it really is expired, and the Docker SDK's own reap removes it.
            removed = {(r.container_id, r.reason) for r in docker_sdk.reap()}
            assert (container_id, "expired") in removed
        finally:
            with contextlib.suppress(docker.errors.NotFound):
                docker.from_env().containers.get(container_id).remove(force=True)


def test_pools_claim_resize_delete(image: str) -> None:
    pool = _name("pool")
    assert sky.create_pool(pool, image, replicas=1) is None  # returns once warm; nothing to read
    try:
        assert extensions.get_pool(pool).idle >= 1
        with pytest.raises(sky.InvalidRequestError):
            sky.create(name=_name("bad"), pool=pool, image=image)
        with sky.create(name=_name("claim"), pool=pool, env={"P": "claimed"}, timeout=600) as sb:
            handle = sb.exec("sh", "-c", 'printf %s "$P"')
            assert handle.wait() == 0 and handle.stdout.read() == "claimed"
            assert extensions.get_pool(pool).claimed == 1
            assert {r.name: r._record["template_name"] for r in sky.ls()}[sb.name] == pool
        sky.set_pool_size(pool, 2)
        assert extensions.get_pool(pool).replicas == 2 and extensions.get_pool(pool).idle == 2
        assert pool in {p.name for p in extensions.list_pools()}
    finally:
        sky.delete_pool(pool)
    with pytest.raises(sky.PoolNotFoundError):
        extensions.get_pool(pool)
    with pytest.raises(sky.PoolNotFoundError) as missing:
        sky.create(name=_name("nopool"), pool=pool)
    assert missing.value.status_code == 404 and not isinstance(missing.value, LookupError)


def test_cold_create_and_pool_claim_times_are_knobs(emulator: EmulatorServer, image: str) -> None:
    pool = _name("timed")
    sky.create_pool(pool, image, replicas=1)
    try:
        emulator.knobs(cold_create_sec=1.5, pool_claim_sec=0.5)
        started = time.monotonic()
        with sky.create(name=_name("cold"), image=image, timeout=600):
            cold = time.monotonic() - started
        started = time.monotonic()
        with sky.create(name=_name("warm"), pool=pool, timeout=600):
            warm = time.monotonic() - started
    finally:
        sky.delete_pool(pool)
    # lower bounds only: the server waits at least what the knob says
    assert cold >= 1.5 and warm >= 0.5


def test_snapshot_pushes_the_filesystem_to_the_registry(image: str) -> None:
    with sky.create(name=_name("snap"), image=image, timeout=600) as sb:
        sb.write_bytes(b"kept", "/srv/marker")
        ref = sb.snapshot()
    assert ref.startswith("127.0.0.1:5000/snapshots:")
    docker.from_env().images.remove(ref, force=True)  # the next create must pull it back
    try:
        with sky.create(name=_name("fromsnap"), image=ref, timeout=600) as restored:
            assert restored.read_bytes("/srv/marker") == b"kept"
    finally:
        docker.from_env().images.remove(ref, force=True)


def test_one_server_is_one_account(image: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SkyPilot's ``ls`` lists one account's sandboxes: another emulator server on the same
    engine (another test session's, another bench run's) neither lists, reaches, terminates
    nor evicts this server's sandboxes, and this server does not see its. Warm pools likewise:
    the other account neither lists, reads, resizes, claims from nor deletes this one's pool, nor
    takes its name."""
    with private_emulator(tmp_path_factory.mktemp("emulator-other"), set_env=False) as other:
        mine = sky.create(name=_name("account"), image=image, timeout=600)
        mine_info = sky.SandboxInfo(name=mine.name, status="RUNNING", image=image, created_at=time.time())
        my_pool, their_pool = _name("account-pool"), _name("other-pool")
        sky.create_pool(my_pool, image, replicas=0)
        try:
            with emulator_env(other.url):
                theirs = sky.create(name=_name("other-account"), image=image, timeout=600)
                assert [s.name for s in sky.ls()] == [theirs.name]  # positive control: ls works there
                extensions.terminate_by_name(mine.name)  # idempotent: "gone", as far as that account can tell
                assert other.admin("POST", f"/evict/{mine.name}") == {"evicted": None}
                with pytest.raises(sky.SandboxNotFoundError):
                    sky.EmulatorSandbox(mine_info).exec("true")
                sky.create_pool(their_pool, image, replicas=0)
                assert [p.name for p in extensions.list_pools()] == [their_pool]  # positive control
                for call in (extensions.get_pool, sky.delete_pool, lambda name: sky.set_pool_size(name, 1)):
                    with pytest.raises(sky.PoolNotFoundError):
                        call(my_pool)
                with pytest.raises(sky.PoolNotFoundError):
                    sky.create(name=_name("claim"), pool=my_pool, timeout=600)
                with pytest.raises(sky.PoolExistsError, match="another emulator account"):
                    sky.create_pool(my_pool, image, replicas=0)
            names = [s.name for s in sky.ls()]
            assert mine.name in names and theirs.name not in names
            assert mine.exec("true").wait() == 0  # untouched by the other account's terminate
            assert extensions.get_pool(my_pool).replicas == 0  # untouched by the other account's calls
            assert their_pool not in {p.name for p in extensions.list_pools()} and my_pool in {
                p.name for p in extensions.list_pools()
            }
            extensions.terminate_by_name(theirs.name)
            with emulator_env(other.url):
                assert [s.name for s in sky.ls()] == [theirs.name]
                theirs.terminate()
                sky.delete_pool(their_pool)
        finally:
            mine.terminate()
            sky.delete_pool(my_pool)
