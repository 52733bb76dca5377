"""One owner context: no process-wide owner, builds per owner (``force_build`` really builds),
pool users in the ledger (a dead owner's use does not count)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest

from osmosis_harbor import settings
from osmosis_harbor.errors import NoOwnerError
from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox import SandboxEnvironment
from osmosis_harbor.sandbox.environment.own_sandbox import SandboxCreator
from osmosis_harbor.sandbox.images.builds import ImageBuildCoordinator
from osmosis_harbor.sandbox.ledger.store import Ledger
from osmosis_harbor.sandbox.owner.context import (
    Role,
    SandboxOwner,
    TrialContext,
    current_owner,
    current_trial,
    guard_scope,
    owner_scope,
    trial_scope,
)
from tests.support.common import REPO, made_environment, make_task


def _environment(task_dir: Path, tmp_path: Path) -> SandboxEnvironment:
    return made_environment(task_dir, tmp_path / f"trial-{uuid.uuid4().hex[:6]}", "ownertest")


async def test_outside_every_owner_a_call_that_needs_one_raises_naming_it() -> None:
    with pytest.raises(NoOwnerError, match=r"the workflow agent's rollout credentials needs an owner.*owner_scope"):
        current_owner("the workflow agent's rollout credentials")
    with pytest.raises(NoOwnerError, match="a trial's scope"), trial_scope():
        pass
    alone = TrialContext.of(
        "alone__env", "a test", settings.current()
    )  # Harbor's CLI: an owner of its own, nothing deferred
    assert current_trial() is None and alone.owns_itself and not alone.defer_termination(asyncio.sleep)
    owner = SandboxOwner.make("test", config=settings.current())
    with owner_scope(owner):
        assert current_owner("a test") is owner
        with trial_scope(head_start=True) as trial:
            assert current_trial() is trial and trial.head_start is not None
            inner = asyncio.ensure_future(asyncio.sleep(0, result=current_owner("a task")))
        assert current_trial() is None
    assert await inner is owner  # a task spawned in the scope keeps its owner
    with pytest.raises(NoOwnerError):
        current_owner("after the scope")


async def test_one_trial_context_carries_owner_role_guard_head_start_and_losses() -> None:
    """Read once per environment: the role from Harbor's session id (a separate verifier's is
    ``{trial}__verifier__{key}``), the guard for the agent's sandbox only, one loss sink and one
    deferral into the trial's scope."""
    from osmosis_harbor.errors import SandboxLostError
    from osmosis_harbor.sandbox.guard import GuardPlan, GuardSession

    owner, guard = SandboxOwner.make("test", config=settings.current()), GuardSession(GuardPlan())
    with owner_scope(owner), trial_scope(head_start=True, guard=guard) as trial:
        agent = TrialContext.of("t1__env", "a test", settings.current())
        verifier = TrialContext.of("t1__verifier__k", "a test", settings.current())
    assert (agent.role, verifier.role) == (Role.AGENT, Role.VERIFIER)
    assert agent.guard is guard and verifier.guard is None  # control: the scope held one
    assert agent.owner is verifier.owner is owner and not agent.owns_itself
    assert agent.head_start is verifier.head_start is trial.head_start is not None
    assert agent.credentials is owner.credentials
    loss = SandboxLostError.of_role("agent", "hb-x", "gone")
    agent.record_loss(loss)
    assert trial.losses == [loss]
    assert verifier.defer_termination(lambda: asyncio.sleep(0)) and len(trial.terminations) == 1
    await asyncio.gather(*trial.terminations)
    with guard_scope(guard):  # validate's guard without a trial: still one scope, one variable
        assert TrialContext.of("v__env", "a test", settings.current()).guard is guard


def test_an_environment_made_outside_every_owner_owns_itself(tmp_path: Path) -> None:
    """Harbor's own CLI makes environments with no backend: each owns itself, apart."""
    task = make_task(tmp_path / "ds", "alone")
    first, second = _environment(task, tmp_path), _environment(task, tmp_path)
    assert first._creator.owns_itself and second._creator.owns_itself and first.owner is not second.owner
    owner = SandboxOwner.make("test", config=settings.current())
    with owner_scope(owner):
        inside = _environment(task, tmp_path)
    assert not inside._creator.owns_itself and inside.owner is owner


def _base_image(tag: str, version: int) -> None:
    """A base image of our own, made again with other content (a cached build cannot reuse it)."""
    client = docker.from_env()
    try:
        client.images.build(
            fileobj=__import__("io").BytesIO(f"FROM debian:trixie-slim\nLABEL ownertest={version}\n".encode()),
            tag=tag,
            rm=True,
        )
    finally:
        client.close()


def _image_id(ref: str) -> str:
    client = docker.from_env()
    try:
        return str(client.images.get(ref).id)
    finally:
        client.close()


async def test_force_build_rebuilds_an_image_another_owner_built(tmp_path: Path) -> None:
    """Builds belong to owners: B's ``force_build`` runs a build (a new image id, its base having
    changed since) although A built that image; without it B reuses it; within one owner,
    concurrent forced builds of one image build it once."""
    base = f"ownertest-base-{uuid.uuid4().hex[:8]}:1"
    await asyncio.to_thread(_base_image, base, 1)
    task = make_task(tmp_path / "ds", "forced", dockerfile=f"FROM {base}\nRUN echo built > /built\n")
    ref = None
    try:
        a, b = SandboxOwner.make("a", config=settings.current()), SandboxOwner.make("b", config=settings.current())
        with owner_scope(a):
            ref, built = await _environment(task, tmp_path).prepare_image()
        assert built and a.builds.stats.built == [ref]
        first = await asyncio.to_thread(_image_id, ref)
        await asyncio.to_thread(_base_image, base, 2)  # what a rebuild would now make differs
        with owner_scope(b):
            again, rebuilt = await _environment(task, tmp_path).prepare_image()
        assert again == ref and not rebuilt and b.builds.stats.reused == [ref]  # control: no force, no build
        assert await asyncio.to_thread(_image_id, ref) == first
        with owner_scope(b):
            envs = [_environment(task, tmp_path) for _ in range(3)]
            results = await asyncio.gather(*(env.prepare_image(force_build=True) for env in envs))
        assert sorted(built for _, built in results) == [False, False, True]  # once within the owner
        assert b.builds.stats.built == [ref]
        assert await asyncio.to_thread(_image_id, ref) != first  # a build really ran
        assert not b.builds._locks  # a lock nobody waits on is dropped
    finally:
        client = docker.from_env()
        for image in (ref, base):
            if image is not None:
                try:
                    client.images.remove(image, force=True)
                except docker.errors.ImageNotFound:
                    pass
        client.close()


async def test_a_coordinator_builds_once_for_concurrent_callers_and_frees_its_lock() -> None:
    builds: list[str] = []
    coordinator = ImageBuildCoordinator()

    async def exists() -> bool:
        return False

    async def build() -> None:
        await asyncio.sleep(0)  # let the other callers queue on the lock
        builds.append("x")

    results = await asyncio.gather(*(coordinator.ensure("x:1", exists=exists, build=build) for _ in range(4)))
    assert builds == ["x"] and sorted(results) == [False, False, False, True]
    assert not coordinator._locks and not coordinator._users


def _dead_process() -> OwnerProcess:
    script = "from osmosis_harbor.owner_process import OwnerProcess; print(OwnerProcess.current().model_dump_json())"
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    owner = OwnerProcess.model_validate_json(out.stdout)
    assert owner.is_dead()
    return owner


def test_a_pools_live_users_exclude_the_asker_and_dead_owners(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    me = OwnerProcess.current()
    ledger.use_pool("docker", "e", "warm-1", "a", me)
    ledger.use_pool("docker", "e", "warm-1", "b", me)
    ledger.use_pool("docker", "e", "warm-1", "crashed", _dead_process())
    ledger.use_pool("docker", "e", "warm-2", "c", me)
    assert [u.user for u in ledger.live_pool_users("docker", "e", "warm-1", besides="a")] == ["b"]
    assert [u.user for u in ledger.pool_users("docker", "e", "warm-1")] == ["a", "b"]  # the dead one's row went
    ledger.release_pool("docker", "e", "warm-1", "b")
    assert ledger.live_pool_users("docker", "e", "warm-1", besides="a") == []


@pytest.mark.parametrize("adopting", [True, False], ids=["ours", "control-without-adoption"])
async def test_stop_terminates_a_handle_that_our_create_did_not_make(
    tmp_path: Path, sandbox_image: str, adopting: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Harbor's stop terminates whatever ``_sandbox`` holds; so does ours, though the handle
    reached it without our create (control: without the adoption, the sandbox outlives stop)."""
    if not adopting:

        async def ignore(self: SandboxCreator, name: str) -> None:
            return None

        monkeypatch.setattr(SandboxCreator, "_adopt_held_handle", ignore)
    owner = SandboxOwner.make("test", config=settings.current())
    with owner_scope(owner):
        env = _environment(make_task(tmp_path / "ds", "held"), tmp_path)
        handle = await env.state.sdk.create.aio(name=env.sandbox_name, image=sandbox_image, timeout=300)
        env.sandbox = handle
        try:
            await env.stop(delete=True)
            listed = {record.name for record in await env.state.sdk.ls.aio()}
            assert (env.sandbox_name in listed) is not adopting
        finally:
            if not adopting:
                handle.terminate()
        assert await owner.close() == []
