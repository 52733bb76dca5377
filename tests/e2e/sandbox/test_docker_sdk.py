"""The Docker implementation of the ``sky.sandbox`` surface.

The conformance suite runs on it through ``sandbox-check`` (``test_sandbox_check.py``: every
check must pass on Docker). Here is what only the Docker emulation promises: labels, TTL
enforcement, reaping, host networking, pool storage and claim safety across tasks and processes. Every wait polls the engine with a
deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests

from osmosis_harbor import settings
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker.config import DockerConfig
from osmosis_harbor.sandbox.docker.labels import OwnerProcess, Role
from osmosis_harbor.sandbox.sdk.calls import Dual

REPO = Path(__file__).resolve().parents[3]


# ── helpers ──────────────────────────────────────────────────────────────────────────────────


from tests.support.common import await_until as apoll  # noqa: E402


def unique(stem: str) -> str:
    return f"t-{stem}-{uuid.uuid4().hex[:6]}"


def api() -> Any:
    return docker_sdk.get_engine().api


def container_gone(ref: str) -> bool:
    try:
        api().inspect_container(ref)
    except docker.errors.NotFound:
        return True
    return False


def run_python(script: str, timeout: float = 90) -> dict[str, Any]:
    """Run *script* in a fresh interpreter (another owner pid); it prints JSON last."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


async def run(sandbox: Any, *argv: str, **kwargs: Any) -> tuple[int, str, str]:
    handle = await sandbox.exec.aio(*argv, **kwargs)
    code = await handle.wait()
    return code, handle.stdout.read(), handle.stderr.read()


@pytest.fixture
async def make_sandbox(docker_sandbox_sdk: Any, sandbox_image: str) -> Any:
    """Factory for sandboxes that are terminated after the test, whatever happens."""
    made: list[Any] = []

    async def factory(stem: str = "sb", **kwargs: Any) -> Any:
        if "pool" not in kwargs:
            kwargs.setdefault("image", sandbox_image)
        kwargs.setdefault("timeout", 300)
        sandbox = await docker_sandbox_sdk.create.aio(name=unique(stem), **kwargs)
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        await sandbox.terminate.aio(wait=True)


@pytest.fixture
def make_pool(docker_sandbox_sdk: Any, sandbox_image: str) -> Iterator[Callable[..., str]]:
    """Factory for pools that are deleted after the test."""
    made: list[str] = []

    def factory(stem: str = "pool", replicas: int = 1, **kwargs: Any) -> str:
        name = unique(stem)
        made.append(name)
        docker_sandbox_sdk.create_pool(name, kwargs.pop("image", sandbox_image), replicas=replicas, **kwargs)
        return name

    yield factory
    for name in made:
        try:
            docker_sandbox_sdk.delete_pool(name)
        except docker_sandbox_sdk.PoolNotFoundError:
            pass


# ── labels, config, validation ───────────────────────────────────────────────────────────────


async def test_labels_and_container_config(make_sandbox: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OH_TEST_SECRET", "s3cr3t-value")
    before = time.time()
    sandbox = await make_sandbox(
        "labels",
        timeout=120,
        namespace="team-a",
        context_name="ctx-1",
        registry="127.0.0.1:5000",
        cpus=0.5,
        memory_gb=0.25,
        env={"PLAIN": "1"},
        secrets=["OH_TEST_SECRET"],
    )
    data = api().inspect_container(sandbox.id)
    labels = data["Config"]["Labels"]
    assert labels[L.MANAGED] == "1"
    assert labels[L.SANDBOX] == sandbox.name == data["Name"].lstrip("/")
    assert labels[L.POOL] == ""
    assert labels[L.OWNER_PID] == str(os.getpid())
    assert labels[L.OWNER_HOST] == socket.gethostname()
    assert labels[L.TTL_SEC] == "120"
    assert labels[L.NAMESPACE] == "team-a"
    created = float(labels[L.CREATED_AT])
    assert before - 1 <= created <= time.time() + 1
    assert float(labels[L.EXPIRES_AT]) == pytest.approx(created + 120, abs=0.01)
    assert not any("s3cr3t-value" in value for value in labels.values()), "secret value in labels"
    host = data["HostConfig"]
    assert host["Init"] is True and host["AutoRemove"] is True
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 256 * 1024**2
    assert data["Config"]["Cmd"] == ["sleep", "120"]
    code, out, _ = await run(sandbox, "sh", "-c", 'printf "%s|%s" "$OH_TEST_SECRET" "$PLAIN"')
    assert (code, out) == (0, "s3cr3t-value|1")


async def test_create_validates_arguments(docker_sandbox_sdk: Any, sandbox_image: str) -> None:
    sdk = docker_sandbox_sdk
    bad_calls: list[tuple[dict[str, Any], str]] = [
        ({"image": sandbox_image, "host_network": True, "block_network": True}, "mutually exclusive"),
        ({"pool": "any-pool", "image": sandbox_image}, "do not pass image= together with pool="),
        ({"pool": "any-pool", "cpus": 1}, "cpus/memory_gb come from the pool"),
        ({}, "image is required unless pool= is given"),
        ({"image": sandbox_image, "timeout": 0}, "timeout .* must be positive"),
        ({"image": sandbox_image, "secrets": ["OH_TEST_DEFINITELY_UNSET"]}, "'OH_TEST_DEFINITELY_UNSET' is not set"),
    ]
    for kwargs, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            await sdk.create.aio(name=unique("bad"), **kwargs)
    assert not [r for r in await sdk.ls.aio() if r.name.startswith("t-bad-")]


async def test_exec_argument_errors(make_sandbox: Any) -> None:
    sandbox = await make_sandbox("execargs")
    with pytest.raises(TypeError):
        await sandbox.exec.aio()
    with pytest.raises(ValueError, match="invalid environment entry 'K'"):
        await sandbox.exec.aio("true", env={"K": 1})
    with pytest.raises(ValueError, match="timeout_seconds must be positive"):
        await sandbox.exec.aio("true", timeout_seconds=0)
    assert docker_sdk.exec_timeout(None) == docker_sdk.exec_timeout(10**6) == 3600
    code, _, _ = await run(sandbox, "true", timeout_seconds=10**6)  # clamped, not refused
    assert code == 0


def test_engine_unreachable_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/no-docker.sock"
    monkeypatch.setenv("DOCKER_HOST", url)
    with pytest.raises(docker_sdk.DockerEngineUnavailable) as info:
        docker_sdk.Engine(DockerConfig.of(settings.current()))
    assert f"Docker engine not reachable at {url}" in str(info.value)
    assert "scripts/bootstrap.sh" in str(info.value)


def test_every_call_has_an_aio_twin(docker_sandbox_sdk: Any) -> None:
    for name in (
        "create",
        "get",
        "ls",
        "reap",
        "remove_all",
        "terminate_by_name",
        "create_pool",
        "set_pool_size",
        "delete_pool",
        "get_pool",
        "list_pools",
    ):
        fn = getattr(docker_sandbox_sdk, name)
        assert callable(fn) and inspect.iscoroutinefunction(fn.aio), name


async def test_sync_and_async_handles(make_sandbox: Any, docker_sandbox_sdk: Any) -> None:
    sandbox = await make_sandbox("handles")
    for method in (sandbox.write_bytes, sandbox.read_bytes, sandbox.terminate, sandbox.status):
        assert inspect.iscoroutinefunction(method.aio)

    def blocking() -> tuple[int, str]:
        handle = sandbox.exec("sh", "-c", "echo blocking; exit 2")
        assert isinstance(handle, docker_sdk.ExecHandle)
        return handle.wait(), handle.stdout.read()

    assert await asyncio.to_thread(blocking) == (2, "blocking\n")
    handle = await sandbox.exec.aio("echo", "async")
    assert isinstance(handle, docker_sdk.AsyncExecHandle)
    assert inspect.iscoroutinefunction(handle.wait)
    assert await handle.wait() == 0 and handle.returncode == 0
    assert handle.stdout.read() == "async\n" and handle.stderr.read() == ""
    names_sync = {r.name for r in await asyncio.to_thread(docker_sandbox_sdk.ls)}
    names_async = {r.name for r in await docker_sandbox_sdk.ls.aio()}
    assert sandbox.name in names_sync and sandbox.name in names_async
    assert await sandbox.status.aio() == "running"


# ── exec timeouts ────────────────────────────────────────────────────────────────────────────


async def test_timeout_is_124_and_kills_the_whole_session(make_sandbox: Any) -> None:
    sandbox = await make_sandbox("timeout")
    # `set -m` puts each background job in its own process group: killing only the first
    # pid's group would miss them, killing the session does not.
    script = "set -m; sleep 3011 & sleep 3012 & sleep 3013; echo finished"
    handle = await sandbox.exec.aio("bash", "-c", script, timeout_seconds=1)
    code = await handle.wait()  # returns at all only because the 1 s deadline fired (sleep 3013 would not)
    assert code == docker_sdk.TIMEOUT_EXIT_CODE and handle.timed_out
    assert "finished" not in handle.stdout.read()

    async def no_sleepers() -> bool:
        _, out, _ = await run(sandbox, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        return not any(f"sleep {n}" in out for n in (3011, 3012, 3013))

    await apoll(no_sleepers, timeout=5, what="timed-out processes to die")
    code, out, _ = await run(sandbox, "echo", "still usable")
    assert (code, out) == (0, "still usable\n")


# ── files ────────────────────────────────────────────────────────────────────────────────────


async def test_file_edge_cases(make_sandbox: Any) -> None:
    sandbox = await make_sandbox("files")
    with pytest.raises(NotADirectoryError):
        await sandbox.write_bytes.aio(b"x", "/etc/passwd/child")
    with pytest.raises(IsADirectoryError):
        await sandbox.write_bytes.aio(b"x", "/tmp")
    with pytest.raises(ValueError, match="sandbox paths must be absolute, got 'relative/path'"):
        await sandbox.write_bytes.aio(b"x", "relative/path")
    assert (await sandbox.read_bytes.aio("/bin/sh"))[:4] == b"\x7fELF"  # symlinks followed
    await sandbox.write_bytes.aio(b"through a symlinked dir", "/bin/oh-test-file")
    assert await sandbox.read_bytes.aio("/usr/bin/oh-test-file") == b"through a symlinked dir"
    mode = await run(sandbox, "stat", "-c", "%a", "/tmp")
    assert mode[1].strip() == "1777", "writing below /tmp must not change its mode"
    await sandbox.terminate.aio(wait=True)
    with pytest.raises(docker_sdk.SandboxNotFoundError):
        await sandbox.read_bytes.aio("/etc/hostname")
    with pytest.raises(docker_sdk.SandboxNotFoundError):
        await sandbox.write_bytes.aio(b"x", "/tmp/x")


# ── lifecycle: TTL, reaping, naming ──────────────────────────────────────────────────────────


async def test_ttl_is_enforced_by_the_container(docker_sandbox_sdk: Any, sandbox_image: str) -> None:
    sandbox = await docker_sandbox_sdk.create.aio(name=unique("ttl"), image=sandbox_image, timeout=2)
    try:
        await apoll(lambda: asyncio.to_thread(container_gone, sandbox.id), timeout=20, what="TTL expiry")
        with pytest.raises(docker_sdk.SandboxNotFoundError):
            await sandbox.exec.aio("true")
    finally:
        await sandbox.terminate.aio(wait=True)


def _fake_sandbox(name: str, *, created_at: float, ttl: int, owner: OwnerProcess | None = None) -> str:
    """A managed container whose labels say what we want, for reap tests."""
    engine = docker_sdk.get_engine()
    labels = L.container_labels(
        sandbox=name,
        role=Role.SANDBOX,
        owner=owner or OwnerProcess.current(),
        created_at=created_at,
        ttl_sec=ttl,
        network="bridge",
    )
    container_id = engine.create_container(
        name=name,
        image=os.environ.get("OSMOSIS_HARBOR_TEST_IMAGE", "debian:trixie-slim"),
        cpus=None,
        memory_gb=None,
        network="bridge",
        ttl_sec=300,
        labels=labels,
    )
    engine.start_container(container_id)
    return container_id


def test_reap_removes_expired_and_frees_the_name(docker_sandbox_sdk: Any, sandbox_image: str) -> None:
    sdk = docker_sandbox_sdk
    with sdk.pause_auto_reap():
        expired = _fake_sandbox(unique("expired"), created_at=time.time() - 100, ttl=10)
        live = sdk.create(name=unique("live"), image=sandbox_image, timeout=300)
        try:
            removed = sdk.reap()
            # Another xdist worker's Docker SDK (its own auto-reap, not paused here) may have
            # removed the expired container first: the same reap, so it is gone either way; when
            # this reap removed it, it says why.
            reasons = {r.container_id: r.reason for r in removed}
            assert reasons.get(expired, "expired") == "expired"
            assert live.id not in reasons
            assert container_gone(expired)
            # A stale holder of a name does not block a new sandbox with that name.
            stale_name = unique("stale")
            _fake_sandbox(stale_name, created_at=time.time() - 100, ttl=10)
            fresh = sdk.create(name=stale_name, image=sandbox_image, timeout=60)
            fresh.terminate()
        finally:
            live.terminate()


def test_reap_dead_owner_but_not_idle_pool_members(docker_sandbox_sdk: Any, sandbox_image: str) -> None:
    sdk = docker_sandbox_sdk
    name, pool = unique("orphan"), unique("orphan-pool")
    with sdk.pause_auto_reap():
        child = run_python(
            f"""
            import json, os
            from osmosis_harbor.sandbox import docker as sdk
            sandbox = sdk.create(name={name!r}, image={sandbox_image!r}, timeout=600)
            sdk.create_pool({pool!r}, {sandbox_image!r}, replicas=1)
            print(json.dumps({{"pid": os.getpid(), "id": sandbox.id}}))
            """
        )
        try:
            assert child["pid"] != os.getpid()
            removed = {r.container_id: r for r in sdk.reap()}
            assert child["id"] in removed, "sandbox of a dead process survived reap()"
            assert "dead" in removed[child["id"]].reason
            assert container_gone(child["id"])
            assert sdk.get_pool(pool).idle == 1, "idle pool member of a dead creator was reaped"
        finally:
            sdk.delete_pool(pool)
            sdk.terminate_by_name(name)


def test_remove_all_filters_by_owner(docker_sandbox_sdk: Any, sandbox_image: str) -> None:
    sandbox = docker_sandbox_sdk.create(name=unique("keep"), image=sandbox_image, timeout=120)
    try:
        removed = docker_sandbox_sdk.remove_all(owner_pid=2**31 - 1)
        assert sandbox.id not in {r.container_id for r in removed}
        assert sandbox.status() == "running"
    finally:
        sandbox.terminate()


async def test_get_and_terminate_by_name(make_sandbox: Any, docker_sandbox_sdk: Any) -> None:
    sdk = docker_sandbox_sdk
    sandbox = await make_sandbox("byname")
    attached = await sdk.get.aio(sandbox.name)
    assert attached.id == sandbox.id
    assert (await run(attached, "echo", "attached"))[1] == "attached\n"
    assert await sdk.terminate_by_name.aio(sandbox.name) is True
    assert await sdk.terminate_by_name.aio(sandbox.name) is False
    with pytest.raises(docker_sdk.SandboxNotFoundError):
        await sdk.get.aio(sandbox.name)


async def test_terminate_without_wait(docker_sandbox_sdk: Any, sandbox_image: str) -> None:
    sandbox = await docker_sandbox_sdk.create.aio(name=unique("nowait"), image=sandbox_image, timeout=120)
    await sandbox.terminate.aio(wait=False)
    await apoll(lambda: asyncio.to_thread(container_gone, sandbox.id), timeout=20, what="removal")


async def test_cancelled_create_leaves_nothing(
    docker_sandbox_sdk: Any, sandbox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel lands while ``create`` runs in the SDK's thread, after its container exists
    and before the call returns: the order is held by events, not left to timing."""
    sdk = docker_sandbox_sdk
    created, release = threading.Event(), threading.Event()
    real = sdk.create

    def create_then_wait(*args: Any, **kwargs: Any) -> Any:
        sandbox = real._fn(*args, **kwargs)
        created.set()
        release.wait(timeout=60)
        return sandbox

    monkeypatch.setattr(sdk, "create", Dual(create_then_wait, on_abandon=real._on_abandon))
    name = unique("cancel")
    task = asyncio.create_task(sdk.create.aio(name=name, image=sandbox_image, timeout=120))
    assert await asyncio.to_thread(created.wait, 60), "create never ran"
    assert not container_gone(name)  # the cancel below hits a sandbox that really exists
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # the awaiting task ends at once, while create has not returned yet
    assert not release.is_set() and not container_gone(name)
    release.set()  # now create returns a handle nobody holds: the abandon hook must remove it
    await apoll(lambda: asyncio.to_thread(container_gone, name), timeout=20, what="abandoned sandbox removal")


# ── networking ───────────────────────────────────────────────────────────────────────────────


class _Pong(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline().strip()
        self.wfile.write(b"pong:" + line + b"\n")


@pytest.fixture
def loopback_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Pong)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def test_host_network_reaches_a_loopback_server(make_sandbox: Any, loopback_server: int) -> None:
    talk = f"exec 3<>/dev/tcp/127.0.0.1/{loopback_server} && echo hi >&3 && read -r reply <&3 && echo $reply"
    host = await make_sandbox("hostnet", host_network=True)
    code, out, err = await run(host, "timeout", "5", "bash", "-c", talk)
    assert (code, out) == (0, "pong:hi\n"), err
    bridged = await make_sandbox("bridged")
    code, out, _ = await run(bridged, "timeout", "5", "bash", "-c", talk)
    assert code != 0 and "pong" not in out, "a bridged sandbox reached the host's loopback"


# ── bounds ───────────────────────────────────────────────────────────────────────────────────


def _bounds_of(container_id: str) -> dict[str, Any]:
    data = api().inspect_container(container_id)
    host = data["HostConfig"]
    (tmp,) = [m for m in data["Mounts"] if m["Destination"] == "/tmp"]
    return {
        "cpus": host["NanoCpus"] / 1e9,
        "memory": host["Memory"],
        "swap": host["MemorySwap"],
        "pids": host["PidsLimit"],
        "tmp_type": tmp["Type"],
    }


DEFAULT_BOUNDS = {"cpus": 1.0, "memory": 2048 * 1024**2, "swap": 2048 * 1024**2, "pids": 1024, "tmp_type": "volume"}


async def test_sandboxes_and_pool_members_get_the_default_bounds(
    make_sandbox: Any, docker_sandbox_sdk: Any, make_pool: Callable[..., str]
) -> None:
    """No resources asked: Harbor's documented sizing, a pid limit and a 1 GiB /tmp, on both
    the create path and the pool path (idle members and the sandbox claimed from them)."""
    sandbox = await make_sandbox("bounds")
    assert _bounds_of(sandbox.id) == DEFAULT_BOUNDS
    code, out, _ = await run(sandbox, "df", "-Pk", "/tmp")
    assert code == 0 and out.split()[-5] == str(1024 * 1024) and out.split()[-1] == "/tmp", out
    pool = make_pool("bpool", replicas=1)
    (member,) = _idle_containers(pool)
    assert _bounds_of(member["Id"]) == DEFAULT_BOUNDS
    claimed = await make_sandbox("bclaim", pool=pool)
    assert _bounds_of(claimed.id) == DEFAULT_BOUNDS
    sized = await make_sandbox("bsized", cpus=0.5, memory_gb=0.5)
    assert {k: _bounds_of(sized.id)[k] for k in ("cpus", "memory", "pids")} == {
        "cpus": 0.5,
        "memory": 512 * 1024**2,
        "pids": 1024,
    }
    code, out, _ = await run(sized, "df", "-Pk", "/tmp")
    assert out.split()[-5] == str(256 * 1024), out  # /tmp is half the memory


@pytest.fixture(scope="module")
def image_with_tmp_files(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> Iterator[str]:
    context = tmp_path_factory.mktemp("tmp-image")
    (context / "Dockerfile").write_text(
        f"FROM {sandbox_image}\nRUN echo baked > /tmp/baked.txt && mkdir -m 700 /tmp/private\n"
    )
    tag = f"osmosis-harbor-test/tmp-files:{uuid.uuid4().hex[:8]}"
    client = api()
    for _ in client.build(path=str(context), tag=tag, rm=True, decode=True):
        pass
    yield tag
    client.remove_image(tag, force=True)


async def test_tmp_keeps_the_images_files_and_its_volume_goes_with_the_sandbox(
    docker_sandbox_sdk: Any, image_with_tmp_files: str
) -> None:
    sandbox = await docker_sandbox_sdk.create.aio(name=unique("tmpseed"), image=image_with_tmp_files, timeout=120)
    try:
        assert await sandbox.read_bytes.aio("/tmp/baked.txt") == b"baked\n"
        code, out, _ = await run(sandbox, "stat", "-c", "%a %n", "/tmp", "/tmp/private")
        assert out.split() == ["1777", "/tmp", "700", "/tmp/private"], out
        await sandbox.write_bytes.aio(b"api", "/tmp/api/written.txt")  # the archive API reaches the tmpfs
        assert (await run(sandbox, "cat", "/tmp/api/written.txt"))[1] == "api"
        (volume,) = [m["Name"] for m in api().inspect_container(sandbox.id)["Mounts"] if m["Destination"] == "/tmp"]
    finally:
        await sandbox.terminate.aio(wait=True)
    with pytest.raises(docker.errors.NotFound):
        api().inspect_volume(volume)


# ── pools ────────────────────────────────────────────────────────────────────────────────────


def _idle_containers(pool: str) -> list[dict[str, Any]]:
    found = api().containers(all=True, filters={"label": [L.MANAGED_FILTER, f"{L.POOL}={pool}"]})
    return [c for c in found if L.is_idle_member_name(c["Names"][0].lstrip("/"))]


async def test_pool_claim_is_fast_records_owner_and_refills(
    docker_sandbox_sdk: Any, make_pool: Callable[..., str]
) -> None:
    sdk = docker_sandbox_sdk
    pool = make_pool(replicas=2)
    assert sdk.get_pool(pool).idle == 2 and len(_idle_containers(pool)) == 2
    idle_before = {c["Id"] for c in _idle_containers(pool)}
    sandbox = await sdk.create.aio(name=unique("claim"), pool=pool, timeout=300)
    try:
        # fast because it is a claim: the sandbox is one of the idle members, no container was started for it
        assert sandbox.id in idle_before, "the claim started a container instead of taking an idle member"
        assert await sandbox.status.aio() == "running"
        record = next(r for r in await sdk.ls.aio() if r.name == sandbox.name)
        assert record.pool == pool and record.owner_pid == os.getpid()
        assert record.expires_at == pytest.approx(time.time() + 300, abs=10)

        async def refilled() -> bool:
            info = await sdk.get_pool.aio(pool)
            return bool(info.idle == 2 and info.claimed == 1)

        await apoll(refilled, timeout=30, what="refill to 2 idle + 1 claimed")
    finally:
        await sandbox.terminate.aio(wait=True)
    assert (await sdk.get_pool.aio(pool)).claimed == 0
    removed = await sdk.delete_pool.aio(pool)
    assert len(removed) == 2 and not _idle_containers(pool)
    with pytest.raises(docker_sdk.PoolNotFoundError):
        await sdk.get_pool.aio(pool)


def _removal_already_in_progress(monkeypatch: pytest.MonkeyPatch, container_id: str) -> None:
    """The engine answers our remove of *container_id* with 409, as when a reaper in another
    process got there first; that removal runs to its end at the first look at the container."""
    api_client = docker_sdk.get_engine().api
    real_remove, real_inspect = api_client.remove_container, api_client.inspect_container
    other_remover: dict[str, bool] = {"started": False}

    def remove_container(target: str, **kwargs: Any) -> None:
        if target != container_id:
            return real_remove(target, **kwargs)
        conflict = requests.Response()
        conflict.status_code = 409
        raise docker.errors.APIError("removal already in progress", response=conflict)

    def inspect_container(target: str) -> Any:
        found = real_inspect(target)
        if target == container_id and not other_remover["started"]:
            other_remover["started"] = True
            real_remove(target, force=True, v=True)
        return found

    monkeypatch.setattr(api_client, "remove_container", remove_container)
    monkeypatch.setattr(api_client, "inspect_container", inspect_container)


@pytest.mark.parametrize("protection", [True, False], ids=["waits", "control-no-wait"])
def test_delete_pool_returns_once_a_member_another_process_is_removing_is_gone(
    docker_sandbox_sdk: Any, make_pool: Callable[..., str], monkeypatch: pytest.MonkeyPatch, protection: bool
) -> None:
    pool = make_pool(replicas=1)
    (member,) = _idle_containers(pool)
    _removal_already_in_progress(monkeypatch, member["Id"])
    if not protection:  # the control: delete_pool trusts a 409 without waiting for it
        launcher = docker_sdk.get_engine()
        real = launcher.remove_container
        monkeypatch.setattr(launcher, "remove_container", lambda cid, **kw: real(cid, **{**kw, "wait": False}))
    removed = docker_sandbox_sdk.delete_pool(pool)
    assert [r.container_id for r in removed] == [member["Id"]]
    left = _idle_containers(pool)
    if protection:
        assert not left
    else:
        assert [c["Id"] for c in left] == [member["Id"]]
        monkeypatch.undo()
        api().remove_container(member["Id"], force=True, v=True)


async def test_claimed_sandbox_keeps_its_own_ttl(docker_sandbox_sdk: Any, make_pool: Callable[..., str]) -> None:
    pool = make_pool(replicas=1)
    sandbox = await docker_sandbox_sdk.create.aio(name=unique("claimttl"), pool=pool, timeout=2)
    try:
        await apoll(lambda: asyncio.to_thread(container_gone, sandbox.id), timeout=20, what="claim TTL expiry")
    finally:
        await sandbox.terminate.aio(wait=True)


async def test_concurrent_claims_never_share_a_container(
    docker_sandbox_sdk: Any, make_pool: Callable[..., str]
) -> None:
    pool = make_pool(replicas=2)
    claims = await asyncio.gather(
        *(docker_sandbox_sdk.create.aio(name=unique(f"cc{i}"), pool=pool, timeout=300) for i in range(5))
    )
    try:
        assert len({s.id for s in claims}) == 5
        for sandbox in claims:
            assert api().inspect_container(sandbox.id)["Name"].lstrip("/") == sandbox.name
            assert (await run(sandbox, "echo", sandbox.name))[1] == sandbox.name + "\n"
    finally:
        await asyncio.gather(*(s.terminate.aio(wait=True) for s in claims))


def test_claims_across_processes_and_shared_pool_specs(docker_sandbox_sdk: Any, make_pool: Callable[..., str]) -> None:
    pool = make_pool(replicas=4)
    script = f"""
        import asyncio, json, uuid
        from osmosis_harbor.sandbox import docker as sdk
        async def main():
            spec = (await sdk.get_pool.aio({pool!r})).spec
            boxes = await asyncio.gather(*(
                sdk.create.aio(name="t-xp-" + uuid.uuid4().hex[:8], pool={pool!r}, timeout=300)
                for _ in range(2)
            ))
            return {{"replicas": spec.replicas, "claims": [[b.name, b.id] for b in boxes]}}
        print(json.dumps(asyncio.run(main())))
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script)],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    claims = [tuple(c) for r in results for c in r["claims"]]
    try:
        assert all(r["replicas"] == 4 for r in results), "another process saw a different pool spec"
        assert len({cid for _, cid in claims}) == 4, f"a container was handed out twice: {claims}"
    finally:
        for name, _ in claims:
            docker_sandbox_sdk.terminate_by_name(name)


def test_set_pool_size_up_and_down(docker_sandbox_sdk: Any, make_pool: Callable[..., str]) -> None:
    sdk = docker_sandbox_sdk
    pool = make_pool(replicas=1)
    info = sdk.set_pool_size(pool, 3)
    assert info.idle == 3 and info.replicas == 3 and len(_idle_containers(pool)) == 3
    info = sdk.set_pool_size(pool, 1)
    assert info.idle == 1 and len(_idle_containers(pool)) == 1
    assert [p.spec.replicas for p in sdk.list_pools() if p.name == pool] == [1]


def test_pool_spec_rules(docker_sandbox_sdk: Any, sandbox_image: str, make_pool: Callable[..., str]) -> None:
    sdk = docker_sandbox_sdk
    pool = make_pool(replicas=0)
    assert sdk.create_pool(pool, sandbox_image, replicas=0).spec.generation == 0  # idempotent
    with pytest.raises(docker_sdk.PoolExistsError):
        sdk.create_pool(pool, sandbox_image, cpus=0.5, replicas=0)
    with pytest.raises(ValueError, match="network"):
        sdk.create(name=unique("net"), pool=pool, host_network=True, timeout=60)
    with pytest.raises(docker_sdk.ImageNotFoundError):
        sdk.create_pool(unique("noimg"), "osmosis-harbor-test/missing:nope", replicas=0)
    with pytest.raises(docker_sdk.PoolNotFoundError):
        sdk.create(name=unique("nopool"), pool=unique("nopool"), timeout=60)
    # An empty pool cold-starts the claim instead of failing the trial.
    sandbox = sdk.create(name=unique("cold"), pool=pool, timeout=60)
    try:
        assert sandbox.pool == pool and sandbox.status() == "running"
    finally:
        sandbox.terminate()


def test_reap_removes_members_of_a_vanished_pool(docker_sandbox_sdk: Any, make_pool: Callable[..., str]) -> None:
    sdk = docker_sandbox_sdk
    pool = make_pool(replicas=1)
    (member,) = _idle_containers(pool)
    for vol in api().volumes(filters={"label": f"{L.POOL_SPEC}={pool}"})["Volumes"]:
        api().remove_volume(vol["Name"])  # the spec disappears behind the SDK's back
    with sdk.pause_auto_reap():
        removed = {r.container_id: r.reason for r in sdk.reap()}
    assert removed.get(member["Id"]) == "pool deleted"
    assert container_gone(member["Id"])


def _tmp_volume_of(container_id: str) -> str:
    (mount,) = [m for m in api().inspect_container(container_id)["Mounts"] if m["Destination"] == "/tmp"]
    return str(mount["Name"])


def _volume_exists(name: str) -> bool:
    try:
        api().inspect_volume(name)
    except docker.errors.NotFound:
        return False
    return True


async def test_a_sandbox_tmp_volume_left_by_docker_rm_is_reaped_and_one_in_use_is_not(
    make_sandbox: Any, docker_sandbox_sdk: Any
) -> None:
    """``docker rm -f`` without ``-v`` (by hand, or a loss) leaves the sandbox's anonymous /tmp
    volume behind: the reap removes it once dangling (our label finds it), never a live one's."""
    gone, alive = await make_sandbox("tmpvol-gone"), await make_sandbox("tmpvol-alive")
    gone_volume, alive_volume = _tmp_volume_of(gone.id), _tmp_volume_of(alive.id)
    assert api().inspect_volume(gone_volume)["Labels"][L.TMP_VOLUME] == "1"
    api().remove_container(gone.id, force=True)  # what `docker rm -f` does: volumes stay
    assert _volume_exists(gone_volume)  # the control: really left behind
    with docker_sandbox_sdk.pause_auto_reap():
        docker_sandbox_sdk.reap()
    assert not _volume_exists(gone_volume)
    assert _volume_exists(alive_volume)  # in use by a live sandbox: the engine's dangling test keeps it
    code, _, _ = await run(alive, "sh", "-c", "echo still > /tmp/x && cat /tmp/x")
    assert code == 0
