"""The owner and the ledger on the fake SDK: what an owner creates is in the ledger before the
create call and leaves it once the SDK says it is gone; terminations survive API faults; pools
are created, adopted and deleted through SkyPilot's calls; a dead owner's leftovers are reaped."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox.ledger.leftovers import Action, reap_dead_owners
from osmosis_harbor.sandbox.ledger.store import Kind, Ledger, State, endpoint_for
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from tests.unit.fake_sky import FakeSky, ServerError
from tests.unit.fake_sky.fixtures import FAKE_IMAGE, FAKE_SDK, fake_cloud, fake_environment, fake_task

__all__ = ["fake_cloud"]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("OSMOSIS_HARBOR_API_RETRY_MAX_WAIT", "0.01")
    return Ledger(tmp_path / "ledger.sqlite3")


@pytest.fixture
async def owner(ledger: Ledger) -> AsyncIterator[SandboxOwner]:
    made = SandboxOwner.make("unit", config=settings.current(), ledger=ledger)
    yield made
    await made.close()


def _entries(ledger: Ledger, kind: Kind) -> dict[str, State]:
    return {e.name: e.state for e in ledger.entries(sdk=FAKE_SDK) if e.kind is kind}


async def test_a_sandbox_is_in_the_ledger_while_it_lives_and_leaves_it_at_stop(
    fake_cloud: FakeSky, owner: SandboxOwner, ledger: Ledger, tmp_path: Path
) -> None:
    with owner_scope(owner):
        environment = fake_environment(fake_task(tmp_path), tmp_path / "trial")
    await environment.start(force_build=False)
    name = environment.sandbox_name
    assert owner.sandboxes.registered(name) and _entries(ledger, Kind.SANDBOX) == {name: State.RUNNING}
    await environment.stop(delete=True)
    await owner.settled()
    assert not owner.sandboxes.registered(name) and _entries(ledger, Kind.SANDBOX) == {}
    assert fake_cloud.live() == []


async def test_the_ledger_has_the_sandbox_before_the_create_call(
    fake_cloud: FakeSky, owner: SandboxOwner, ledger: Ledger, tmp_path: Path
) -> None:
    seen: list[dict[str, State]] = []
    fake_cloud.faults.fail("create", RuntimeError("the create call"))  # raise at the call, after the ledger
    original = fake_cloud.faults.check

    def spy(call: str, sandbox: str | None = None) -> None:
        if call == "create":
            seen.append(_entries(ledger, Kind.SANDBOX))
        original(call, sandbox)

    fake_cloud.faults.check = spy  # type: ignore[method-assign]
    with owner_scope(owner):
        environment = fake_environment(fake_task(tmp_path), tmp_path / "trial")
    with pytest.raises(RuntimeError, match="the create call"):
        await environment.start(force_build=False)
    assert seen == [{environment.sandbox_name: State.CREATING}]
    assert _entries(ledger, Kind.SANDBOX) == {}, "ls() said nothing was made: the entry is closed"


async def test_a_termination_that_meets_api_faults_is_retried_until_the_sandbox_is_gone(
    fake_cloud: FakeSky, owner: SandboxOwner, ledger: Ledger, tmp_path: Path
) -> None:
    with owner_scope(owner):
        environment = fake_environment(fake_task(tmp_path), tmp_path / "trial")
    await environment.start(force_build=False)
    fake_cloud.faults.fail("terminate", ServerError("busy"), times=2)
    await environment.stop(delete=True)
    await owner.settled()
    assert fake_cloud.live() == [] and len(fake_cloud.calls_of("terminate")) >= 3
    assert _entries(ledger, Kind.SANDBOX) == {}


async def test_the_owners_close_terminates_what_it_still_has(
    fake_cloud: FakeSky, owner: SandboxOwner, ledger: Ledger, tmp_path: Path
) -> None:
    with owner_scope(owner):
        environment = fake_environment(fake_task(tmp_path), tmp_path / "trial")
    await environment.start(force_build=False)
    assert await owner.close() == []
    assert fake_cloud.live() == [] and _entries(ledger, Kind.SANDBOX) == {}


async def test_a_pool_is_created_adopted_when_it_exists_and_deleted(
    fake_cloud: FakeSky, owner: SandboxOwner, ledger: Ledger
) -> None:
    made = await pools.create(owner.sandboxes, FAKE_SDK, "warm-abc", FAKE_IMAGE, 2, {"cpus": 1, "memory_gb": 2.0})
    assert made is None and fake_cloud.pools() == ["warm-abc"]
    assert "warm-abc" in _entries(ledger, Kind.POOL)
    other = SandboxOwner.make("other", config=settings.current(), ledger=ledger)
    adopted = await pools.create(other.sandboxes, FAKE_SDK, "warm-abc", FAKE_IMAGE, 3, {})
    assert adopted is not None and "adopted the existing pool" in adopted  # a 409 is an existing pool
    assert (await fake_cloud.get_pool.aio("warm-abc")).size == 3
    assert await pools.delete(other.sandboxes, FAKE_SDK, ["warm-abc"]) == []
    assert fake_cloud.pools() == ["warm-abc"], "the first owner still uses it: left to that owner"
    assert await pools.delete(owner.sandboxes, FAKE_SDK, ["warm-abc"]) == []
    assert fake_cloud.pools() == [] and _entries(ledger, Kind.POOL) == {}


async def test_deleting_a_pool_ends_the_owners_claimed_members_first(
    fake_cloud: FakeSky, owner: SandboxOwner, ledger: Ledger, tmp_path: Path
) -> None:
    await pools.create(owner.sandboxes, FAKE_SDK, "warm-claimed", FAKE_IMAGE, 1, {})
    task = fake_task(tmp_path, "generic")
    (task / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 60.0\n[environment]\n')
    with owner_scope(owner):
        environment = fake_environment(task, tmp_path / "trial", pool="warm-claimed")
    await environment.start(force_build=False)
    assert [r.pool for r in await fake_cloud.ls.aio()] == ["warm-claimed"]
    assert await pools.delete(owner.sandboxes, FAKE_SDK, ["warm-claimed"]) == []
    assert fake_cloud.pools() == [] and fake_cloud.live() == []


def _dead_owner() -> OwnerProcess:
    """This host, this pid, another process's start time: a pid reused, so the owner is dead."""
    return OwnerProcess(pid=os.getpid(), host=socket.gethostname(), start="not-this-process")


def test_a_dead_owners_leftovers_are_reaped_and_a_dry_run_only_lists_them(fake_cloud: FakeSky, ledger: Ledger) -> None:
    """(Blocking: the reaper runs in a thread of its own, with the SDK's blocking calls.)"""
    live = fake_cloud.create(name="left-behind", image=FAKE_IMAGE)
    fake_cloud.create_pool("left-pool", FAKE_IMAGE, replicas=1)
    endpoint = endpoint_for(FAKE_SDK, settings.current())
    for kind, name in ((Kind.SANDBOX, live.name), (Kind.SANDBOX, "long-gone"), (Kind.POOL, "left-pool")):
        ledger.record(kind, FAKE_SDK, endpoint, name, _dead_owner())
    listed = {
        item.name: item.action for item in reap_dead_owners(FAKE_SDK, settings.current(), ledger=ledger, dry_run=True)
    }
    assert listed == {"left-behind": Action.WOULD_REMOVE, "long-gone": Action.ALREADY_GONE,
                      "left-pool": Action.WOULD_REMOVE}  # fmt: skip
    assert fake_cloud.live() == ["left-behind"] and fake_cloud.pools() == ["left-pool"]
    reaped = {item.name: item.action for item in reap_dead_owners(FAKE_SDK, settings.current(), ledger=ledger)}
    assert reaped == {"left-behind": Action.TERMINATED, "long-gone": Action.ALREADY_GONE, "left-pool": Action.DELETED}
    assert fake_cloud.live() == [] and fake_cloud.pools() == [] and ledger.entries(sdk=FAKE_SDK) == []


def test_a_live_owners_sandboxes_are_never_reaped(fake_cloud: FakeSky, ledger: Ledger) -> None:
    live = fake_cloud.create(name="still-mine", image=FAKE_IMAGE)
    ledger.record(Kind.SANDBOX, FAKE_SDK, endpoint_for(FAKE_SDK, settings.current()), live.name, OwnerProcess.current())
    assert reap_dead_owners(FAKE_SDK, settings.current(), ledger=ledger) == []
    assert fake_cloud.live() == ["still-mine"]
