"""The skypilot-emulator refuses what SkyPilot refuses, by default: one test per row of what
SkyPilot's docs, examples and Harbor show and the emulator used to allow (an empty pool's
claim, ``create_pool`` twice or not warm in time, ``delete_pool`` with a claimed member, the
error shapes, the SDK surface, ``ls()`` records, exit 127, ``wait(timeout=)``, the text calls,
parent directories, secrets). A real server process on the real engine; each refusal has its
positive control (the same call succeeds once the condition is gone)."""

from __future__ import annotations

import os
import uuid

import pytest

from osmosis_harbor.sandbox import emulator as sky
from osmosis_harbor.sandbox.emulator.client import extensions
from osmosis_harbor.sandbox.sdk.errors import Meaning, is_api_fault, meaning
from tests.support.common import wait_until
from tests.support.emulator import EmulatorServer, private_emulator

BUILTINS = (ValueError, LookupError, FileNotFoundError, IsADirectoryError, ConnectionError, TimeoutError)
DOCUMENTED_SURFACE = {"create", "ls", "create_pool", "set_pool_size", "delete_pool", "aclose"}


def _name(stem: str) -> str:
    return f"strict-{stem}-{uuid.uuid4().hex[:6]}"


def _strict(exc: BaseException, status: int | None) -> None:
    """SkyPilot's shape: a RuntimeError with the answer's status, none of the builtins."""
    assert isinstance(exc, RuntimeError) and not isinstance(exc, BUILTINS), type(exc).__mro__
    assert getattr(exc, "status_code", None) == status


def test_a_claim_from_a_pool_with_no_ready_member_fails(image: str) -> None:
    empty, one = _name("empty"), _name("one")
    sky.create_pool(empty, image, replicas=0)
    sky.create_pool(one, image, replicas=1)
    try:
        with pytest.raises(sky.PoolExhaustedError) as caught:
            sky.create(name=_name("claim"), pool=empty, timeout=300)
        _strict(caught.value, 409)
        assert meaning(caught.value) is not Meaning.MISSING  # not "no such pool": our claim falls back
        with pytest.raises(sky.PoolExhaustedError):  # three from a pool of one: all or nothing
            sky.create(name=_name("batch"), pool=one, num_sandboxes=3, timeout=300)
        assert extensions.get_pool(one).claimed == 0
        first = sky.create(name=_name("first"), pool=one, timeout=300)  # positive control
        try:
            assert first.exec("true").wait() == 0
            with pytest.raises(sky.PoolExhaustedError):  # its only member is claimed, the refill not ready
                sky.create(name=_name("second"), pool=one, timeout=300)
        finally:
            first.terminate()
    finally:
        sky.delete_pool(empty)
        sky.delete_pool(one)


def test_create_pool_on_an_existing_name_raises(image: str) -> None:
    pool = _name("twice")
    sky.create_pool(pool, image, replicas=0)
    try:
        with pytest.raises(sky.PoolExistsError, match="already exists") as caught:
            sky.create_pool(pool, image, replicas=0)
        _strict(caught.value, 409)
        sky.set_pool_size(pool, 1)  # what one does with an existing pool
        assert extensions.get_pool(pool).replicas == 1
    finally:
        sky.delete_pool(pool)


def test_a_pool_not_warm_in_time_raises_and_keeps_warming(emulator: EmulatorServer, image: str) -> None:
    emulator.knobs(pool_warm_sec=10, pool_warm_timeout_sec=0)  # warm well after a loaded engine has started both
    pool = _name("slow")
    with pytest.raises(sky.PoolWarmTimeoutError, match=r"didn't fully warm within the SDK timeout.*last seen 0/2"):
        sky.create_pool(pool, image, replicas=2)
    try:
        assert extensions.get_pool(pool).replicas == 2  # it exists
        with pytest.raises(sky.PoolExhaustedError):  # a warming member is not ready
            sky.create(name=_name("early"), pool=pool, timeout=300)
        wait_until(lambda: extensions.get_pool(pool).idle == 2, timeout=60, what="the pool to warm")
        with sky.create(name=_name("late"), pool=pool, timeout=300) as sb:  # positive control
            assert sb.exec("true").wait() == 0
    finally:
        sky.delete_pool(pool)


def test_delete_pool_with_a_claimed_member_answers_500(image: str) -> None:
    pool = _name("busy")
    sky.create_pool(pool, image, replicas=1)
    member = sky.create(name=_name("member"), pool=pool, timeout=300)
    try:
        with pytest.raises(sky.PoolInUseError, match=member.name) as caught:
            sky.delete_pool(pool)
        _strict(caught.value, 500)
        assert is_api_fault(caught.value)  # a 500: our safe-call retries apply
        assert member.exec("true").wait() == 0  # nothing was deleted under it
    finally:
        member.terminate()
    sky.delete_pool(pool)  # positive control: with the member gone, it goes
    with pytest.raises(sky.PoolNotFoundError):
        extensions.get_pool(pool)


def test_every_error_is_runtime_error_shaped_with_its_status(emulator: EmulatorServer, image: str) -> None:
    with sky.create(name=_name("errors"), image=image, timeout=300) as sb:
        cases = [
            (lambda: sb.read_bytes("/no/such/file"), 404),
            (lambda: sb.read_bytes("/etc"), 400),
            (lambda: sb.write_bytes(b"x", "/no/such/dir/file"), 404),
            (lambda: sb.exec("true", timeout_seconds=3601), 400),
            (lambda: sky.create(name="Not_DNS", image=image), 400),
            (lambda: sky.create(name=_name("nopool"), pool=_name("nopool")), 404),
            (lambda: sky.create(name=sb.name, image=image), 409),
            (lambda: sky.create(name=_name("ports"), image=image, ports=[80]), 501),
        ]
        for call, status in cases:
            with pytest.raises(sky.SandboxApiError) as caught:
                call()
            _strict(caught.value, status)
        emulator.fault("503", path=f"/sandboxes/{sb.name}/files", count=4)  # past the SDK's own 3 retries
        with pytest.raises(sky.ApiUnavailableError) as unavailable:
            sb.read_bytes("/etc/hostname")
        _strict(unavailable.value, 503)
        emulator.fault("reset", path=f"/sandboxes/{sb.name}/files")
        with pytest.raises(sky.ApiServerConnectionError) as reset:  # sky.exceptions' documented name
            sb.read_bytes("/etc/hostname")
        _strict(reset.value, None)
        assert is_api_fault(reset.value) and is_api_fault(unavailable.value)
    with pytest.raises(sky.SandboxNotFoundError) as gone:
        sb.exec("true")
    _strict(gone.value, 404)


def test_the_sdk_surface_is_the_documented_one(image: str) -> None:
    calls = {name for name in sky.__all__ if not name[0].isupper()}
    assert calls == DOCUMENTED_SURFACE
    for extension in ("get_pool", "list_pools", "terminate_by_name"):
        assert not hasattr(sky, extension) and hasattr(extensions, extension)
    with pytest.raises(TypeError):  # SkyPilot's create_pool has no network option
        sky.create_pool(_name("nonet"), image, replicas=0, block_network=True)  # type: ignore[call-arg]
    with sky.create(name=_name("surface"), image=image, timeout=300) as sb:
        for call in ("exec", "write_bytes", "read_bytes", "write_text", "read_text", "terminate", "snapshot"):
            assert callable(getattr(getattr(sb, call), "aio", None)), call
        assert not hasattr(sb, "put_archive") and isinstance(sb.status, str)  # a record field, not a call


def test_ls_gives_terminable_records_with_their_pool(image: str) -> None:
    pool = _name("listed")
    sky.create_pool(pool, image, replicas=1)
    try:
        claimed = sky.create(name=_name("claimed"), pool=pool, timeout=300)
        plain = sky.create(name=_name("plain"), image=image, timeout=300)
        listed = {r.name: r for r in sky.ls()}
        assert listed[claimed.name]._record["template_name"] == pool and listed[claimed.name].status == "RUNNING"
        assert listed[plain.name]._record["template_name"] is None
        listed[claimed.name].terminate()  # through the record, as SkyPilot's pool clean-up does
        listed[plain.name].terminate()
        assert not {claimed.name, plain.name} & {r.name for r in sky.ls()}
    finally:
        sky.delete_pool(pool)


def test_a_missing_binary_or_workdir_exits_127(image: str) -> None:
    with sky.create(name=_name("127"), image=image, timeout=300) as sb:
        binary = sb.exec("no-such-binary")
        assert binary.wait() == 127 and "not found" in binary.stderr.read()
        workdir = sb.exec("true", workdir="/no/such/dir")
        assert workdir.wait() == 127 and "/no/such/dir" in workdir.stderr.read() and workdir.stdout.read() == ""
        assert sb.exec("pwd", workdir="/tmp").stdout.read() == "/tmp\n"  # positive control


async def test_wait_takes_a_timeout(image: str) -> None:
    with sky.create(name=_name("wait"), image=image, timeout=300) as sb:
        slow = sb.exec("sh", "-c", "sleep 3; exit 5")
        with pytest.raises(sky.ApiTimeoutError):
            slow.wait(timeout=0.5)
        assert slow.wait(timeout=30) == 5  # the result is still there to wait for
        handle = await sb.exec.aio("sh", "-c", "exit 6")
        assert await handle.wait(timeout=30) == 6


def test_text_calls_and_no_implicit_parent_directories(image: str) -> None:
    with sky.create(name=_name("text"), image=image, timeout=300) as sb:
        with pytest.raises(sky.RemoteFileNotFoundError, match="/srv/new"):
            sb.write_text("hé", "/srv/new/file.txt")
        assert sb.exec("mkdir", "-p", "/srv/new").wait() == 0  # what SkyPilot's examples do first
        sb.write_text("hé", "/srv/new/file.txt")
        assert sb.read_text("/srv/new/file.txt") == "hé" and sb.read_bytes("/srv/new/file.txt") == "hé".encode()


def test_secrets_come_from_the_store_not_the_callers_environment(
    emulator: EmulatorServer, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"OH_STRICT_SECRET_{uuid.uuid4().hex[:6].upper()}"
    monkeypatch.setenv(secret, "from-the-shell")  # exported here: SkyPilot would not see it
    with pytest.raises(sky.InvalidRequestError, match="secrets store"):
        sky.create(name=_name("secret"), image=image, secrets=[secret], timeout=300)
    emulator.admin("PUT", f"/secrets/{secret}", {"value": "from-the-store"})
    try:
        with sky.create(name=_name("secret"), image=image, secrets=[secret], timeout=300) as sb:
            handle = sb.exec("printenv", secret)
            assert handle.wait() == 0 and handle.stdout.read() == "from-the-store\n"
        assert "from-the-store" not in emulator.log.read_text()
    finally:
        emulator.admin("DELETE", f"/secrets/{secret}")
    assert os.environ[secret] == "from-the-shell"


def test_a_secret_named_at_start_comes_from_the_servers_environment(
    image: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"OH_STRICT_START_{uuid.uuid4().hex[:6].upper()}"
    monkeypatch.setenv(secret, "server-side")  # inherited by the server started below
    with private_emulator(tmp_path_factory.mktemp("emulator-secret"), extra=("--secret", secret)) as server:
        with sky.create(name=_name("startsecret"), image=image, secrets=[secret], timeout=300) as sb:
            assert sb.exec("printenv", secret).stdout.read() == "server-side\n"
        assert "server-side" not in server.log.read_text()
