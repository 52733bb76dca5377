"""API faults survived on purpose (``sandbox/sdk/faults.py``), on the skypilot-emulator with
faults injected by its server: each safe call is retried through 503, 429, a reset and a hang;
a create is retried only when ``ls`` shows it made nothing; an exec is never retried, and its
failure becomes a lost sandbox (a fresh one for the retry); an eviction is a lost sandbox.

The emulator SDK's own retry budget is set to 0 here, so every retry seen is ours; each test's
positive control shows the bare SDK call fails under the same fault."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError, SandboxLostError
from osmosis_harbor.sandbox import emulator as sky
from osmosis_harbor.sandbox.emulator.client import extensions
from osmosis_harbor.sandbox.sdk.faults import (
    CALL_SAFETY,
    ApiRetry,
    Safety,
    create_checked,
    is_api_fault,
    retry_safe,
    terminate_by_name,
)
from osmosis_harbor.sandbox.sdk.liveness import sandbox_state
from tests.support.emulator import (
    EmulatorServer,
    private_emulator,
    push_to_local_registry,
)
from tests.support.ledger import FAULT_PREFIXES, environment_for, remove_own_emulator_sandboxes


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    with private_emulator(
        tmp_path_factory.mktemp("emulator"), leftovers=lambda _server: remove_own_emulator_sandboxes(FAULT_PREFIXES)
    ) as server:
        yield server


@pytest.fixture(scope="module")
def image(sandbox_image: str) -> str:
    return push_to_local_registry(sandbox_image)


@pytest.fixture(autouse=True)
def _no_sdk_retries(emulator: EmulatorServer, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator.reset()
    monkeypatch.setenv("OSMOSIS_HARBOR_EMULATOR_RETRIES", "0")
    monkeypatch.setenv("OSMOSIS_HARBOR_API_RETRY_MAX_WAIT", "0.2")


def _name(stem: str) -> str:
    return f"fault-{stem}-{uuid.uuid4().hex[:6]}"


async def test_the_table_names_every_call_and_refuses_blind_retries_of_the_unsafe() -> None:
    assert {c for c, s in CALL_SAFETY.items() if s is Safety.SAFE} >= {"ls", "terminate", "read_bytes", "set_pool_size"}
    assert CALL_SAFETY["create"] is Safety.SAFE_IF_ABSENT
    assert CALL_SAFETY["exec"] is Safety.UNSAFE_ONCE_STARTED
    with pytest.raises(ConfigError, match="exec"):
        await retry_safe("exec", ApiRetry.of(settings.current()), sky.ls.aio)
    assert is_api_fault(sky.ApiUnavailableError("503")) and is_api_fault(sky.RateLimitError("429"))
    assert is_api_fault(sky.ApiConnectionError("reset")) and is_api_fault(sky.ApiTimeoutError("hang"))
    assert not is_api_fault(sky.SandboxNotFoundError("gone")) and not is_api_fault(FileNotFoundError("/x"))


@pytest.mark.parametrize("kind", ["503", "429", "reset"])
async def test_ls_is_retried_through(emulator: EmulatorServer, kind: str) -> None:
    emulator.fault(kind, path="/sandboxes", method="GET", count=1)
    with pytest.raises(sky.SandboxApiError):  # positive control: the bare call fails
        await sky.ls.aio()
    emulator.fault(kind, path="/sandboxes", method="GET", count=2)
    assert isinstance(await retry_safe("ls", ApiRetry.of(settings.current()), sky.ls.aio), list)
    assert emulator.stats()["faults"] == {kind: 3}


async def test_a_hung_ls_times_out_and_is_retried(emulator: EmulatorServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_EMULATOR_TIMEOUT", "1")
    emulator.knobs(hang_sec=5)
    emulator.fault("hang", path="/sandboxes", method="GET", count=1)
    assert isinstance(await retry_safe("ls", ApiRetry.of(settings.current()), sky.ls.aio), list)
    assert emulator.stats()["faults"] == {"hang": 1}


async def test_read_bytes_and_terminate_are_retried(emulator: EmulatorServer, image: str) -> None:
    sb = await sky.create.aio(name=_name("rt"), image=image, timeout=600)
    try:
        emulator.fault("503", path=f"{sb.path}/files", method="GET", count=1)
        with pytest.raises(sky.ApiUnavailableError):
            await sb.read_bytes.aio("/etc/hostname")
        emulator.fault("reset", path=f"{sb.path}/files", method="GET", count=2)
        assert await retry_safe("read_bytes", ApiRetry.of(settings.current()), sb.read_bytes.aio, "/etc/hostname")
        emulator.fault("429", path=sb.path, method="DELETE", count=2)
        await retry_safe("terminate", ApiRetry.of(settings.current()), sb.terminate.aio, wait=True)
        assert (await sandbox_state(sky, sb.name)).status is None
        assert emulator.stats()["faults"] == {"503": 1, "reset": 2, "429": 2}
    finally:
        await sb.terminate.aio()


async def test_set_pool_size_and_delete_pool_are_retried(emulator: EmulatorServer, image: str) -> None:
    pool = _name("pool")
    await sky.create_pool.aio(pool, image, replicas=0)
    try:
        emulator.fault("503", path=f"/pools/{pool}", method="PUT", count=1)
        with pytest.raises(sky.ApiUnavailableError):  # positive control
            await sky.set_pool_size.aio(pool, 1)
        emulator.fault("503", path=f"/pools/{pool}", method="PUT", count=2)
        await retry_safe("set_pool_size", ApiRetry.of(settings.current()), sky.set_pool_size.aio, pool, 1)
        assert extensions.get_pool(pool).replicas == 1
        emulator.fault("reset", path=f"/pools/{pool}", method="DELETE", count=2)
        await retry_safe("delete_pool", ApiRetry.of(settings.current()), sky.delete_pool.aio, pool)
        assert emulator.stats()["faults"] == {"503": 3, "reset": 2}
    finally:
        with contextlib.suppress(sky.PoolNotFoundError):
            await sky.delete_pool.aio(pool)
    with pytest.raises(sky.PoolNotFoundError):
        extensions.get_pool(pool)


async def test_a_sandbox_is_terminated_by_name_through_its_ls_record(emulator: EmulatorServer, image: str) -> None:
    """SkyPilot documents no terminate by name: the record ``ls()`` gives is terminated, the
    path a crashed owner's reaper and a half-made create take (the emulator has no shortcut)."""
    assert not hasattr(sky, "terminate_by_name")
    sb = await sky.create.aio(name=_name("byname"), image=image, timeout=600)
    emulator.fault("503", path=sb.path, method="DELETE", count=2)
    await terminate_by_name(sky, sb.name, ApiRetry.of(settings.current()))
    assert (await sandbox_state(sky, sb.name)).status is None
    assert emulator.stats()["calls_by_route"].get("DELETE /sandboxes/{name}") == 3  # two faulted, then done
    await terminate_by_name(sky, sb.name, ApiRetry.of(settings.current()))  # gone: nothing to do


async def test_a_create_that_made_nothing_is_retried(emulator: EmulatorServer, image: str) -> None:
    name = _name("create")
    emulator.fault("reset", path="/sandboxes", method="POST", count=1)
    sb = await create_checked(
        sky, name, lambda: sky.create.aio(name=name, image=image, timeout=600), ApiRetry.of(settings.current())
    )
    try:
        assert emulator.stats()["faults"] == {"reset": 1}
        assert [r.name for r in await sky.ls.aio() if r.name == name] == [name]
    finally:
        await sb.terminate.aio()


async def test_a_create_that_made_its_sandbox_is_not_doubled(emulator: EmulatorServer, image: str) -> None:
    """The answer of a create that ran is lost (the server made the sandbox, the client saw a
    reset): ``ls`` shows it, so the half-made sandbox is terminated before the create again."""
    name = _name("made")
    calls = 0

    async def create() -> sky.EmulatorSandbox:
        nonlocal calls
        calls += 1
        made = await sky.create.aio(name=name, image=image, timeout=600)
        if calls == 1:
            raise sky.ApiConnectionError("connection reset after the server answered")
        return made

    sb = await create_checked(sky, name, create, ApiRetry.of(settings.current()))
    try:
        assert calls == 2
        assert [r.name for r in await sky.ls.aio() if r.name == name] == [name]
    finally:
        await sb.terminate.aio()


async def test_an_unrecorded_exec_is_never_retried_and_its_fault_is_a_lost_sandbox(
    emulator: EmulatorServer, image: str, tmp_path
) -> None:
    """Without an exec record (the local engine's case) a launch fault loses the sandbox; with
    one, the launch is resumed through the record (``tests/e2e/sandbox/test_exec_records.py``)."""
    env = environment_for("skypilot-emulator", tmp_path, image, stem="fault")
    await env.start(force_build=False)
    env._records.enabled = False
    try:
        emulator.fault("reset", path=f"/sandboxes/{env.sandbox_name}/exec", count=1)
        with pytest.raises(SandboxLostError, match="API failed mid-call"):
            await env.exec("echo once >> /tmp/ran")
        assert emulator.stats()["faults"] == {"reset": 1}
        # The reset came before the server ran it; a retry would have run it: it never ran.
        record = next(r for r in await sky.ls.aio() if r.name == env.sandbox_name)
        with pytest.raises(sky.RemoteFileNotFoundError):
            await record.read_bytes.aio("/tmp/ran")
        with pytest.raises(SandboxLostError):  # the trial's sandbox is done with: fail fast
            await env.exec("true")
    finally:
        await env.stop(delete=True)
    assert (await sandbox_state(sky, env.sandbox_name)).status is None


async def test_an_eviction_is_a_lost_sandbox(emulator: EmulatorServer, image: str, tmp_path) -> None:
    env = environment_for("skypilot-emulator", tmp_path, image, stem="fault")
    await env.start(force_build=False)
    try:
        emulator.fault("evict", path=f"/sandboxes/{env.sandbox_name}/exec", count=1)
        with pytest.raises(SandboxLostError, match="gone"):
            await env.exec("true")
    finally:
        await env.stop(delete=True)
