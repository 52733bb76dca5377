"""The ledger (``sandbox/ledger/store.py``) and reaping on any SDK (``sandbox/ledger/leftovers.py``): kill -9
of an owner mid-rollout and mid-prewarm, and a terminate that fails twice, leave 0 sandboxes and
0 pools of the dead owner, in the ledger and in ``ls``, after ``cleanup`` or the next start; a
live owner's are left alone. On the skypilot-emulator and on Docker. Each test's ledger is its
own file (``OSMOSIS_HARBOR_LEDGER``), shared with the processes it starts."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from harbor.trial.queue import TrialQueue

from osmosis_harbor import settings
from osmosis_harbor.agents.native import NotTrainableWarning
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox import environment_config, load_sandbox_sdk
from osmosis_harbor.sandbox.emulator.client import extensions
from osmosis_harbor.sandbox.ledger.leftovers import Action, reap_dead_owners
from osmosis_harbor.sandbox.ledger.store import Kind, Ledger, State, default_ledger
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes
from tests.support.common import REPO, TASKS, wait_until
from tests.support.emulator import (
    EmulatorServer,
    private_emulator,
    push_to_local_registry,
)
from tests.support.ledger import LEDGER_PREFIXES, cleanup, environment_for, remove_own_emulator_sandboxes, start_owner

# A terminate refused in this process (the handle's own, patched) and what the owner's registry and
# ledger do about it are this process's, the same whichever SDK made the sandbox: the Docker path
# suffices. The SDK's own part, reaping through its API once the owner died, runs on both.
OWNER_RETRY_SDKS = ["docker"]
# On Docker a dead owner's sandbox is also what any other process's background reap removes
# (engine-wide, by design): between the kill and the cleanup under test, no other test may run.
KILLED_OWNER_SDKS = ["skypilot-emulator", pytest.param("docker", marks=pytest.mark.exclusive)]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    with private_emulator(
        tmp_path_factory.mktemp("emulator"), leftovers=lambda _server: remove_own_emulator_sandboxes(LEDGER_PREFIXES)
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator: EmulatorServer) -> Ledger:
    emulator.reset()
    monkeypatch.setenv("OSMOSIS_HARBOR_LEDGER", str(tmp_path / "ledger.sqlite3"))
    monkeypatch.setenv("OSMOSIS_HARBOR_API_RETRY_MAX_WAIT", "0.2")
    return default_ledger(settings.current())


@pytest.fixture(scope="module")
def images(sandbox_image: str, emulator: EmulatorServer) -> dict[str, str]:
    return {"skypilot-emulator": push_to_local_registry(sandbox_image), "docker": sandbox_image}


def _pool() -> str:
    return f"ledger-pool-{uuid.uuid4().hex[:6]}"


def _listed(sdk: ModuleType, name: str) -> bool:
    return name in {r.name for r in sdk.ls()}


def _pool_listed(sdk: ModuleType, name: str) -> bool:
    """Read from the server's pool view on the emulator (SkyPilot's SDK lists no pools)."""
    lister = getattr(sdk, "list_pools", None) or extensions.list_pools
    return name in {p.name for p in lister()}


def _write_rows(path: str, start: int) -> None:
    ledger = Ledger(Path(path))
    for i in range(start, start + 50):
        ledger.record(Kind.SANDBOX, "docker", "e", f"sb-{i}", OwnerProcess.current())


def test_the_ledger_is_shared_by_processes_writing_at_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    Ledger(path)
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_write_rows, args=(str(path), n * 50)) for n in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    entries = Ledger(path).entries(sdk="docker")
    assert len(entries) == 150 and len({e.owner.pid for e in entries}) == 3
    assert all(e.state is State.CREATING and e.owner.is_dead() for e in entries)


@pytest.mark.parametrize("sdk_name", KILLED_OWNER_SDKS)
def test_kill_9_mid_rollout_and_mid_prewarm_leaves_nothing_after_cleanup(
    sdk_name: str, tmp_path: Path, ledger: Ledger, images: dict[str, str]
) -> None:
    sdk = load_sandbox_sdk(sdk_name)
    pool = _pool()
    owner, name = start_owner(sdk_name, tmp_path, images[sdk_name], pool)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    # Positive control: the dead owner's sandbox and pool are there, and the ledger names them.
    assert _listed(sdk, name) and _pool_listed(sdk, pool)
    assert {(e.kind, e.name) for e in ledger.entries()} == {(Kind.SANDBOX, name), (Kind.POOL, pool)}
    dry = cleanup(sdk_name, "--dry-run", "--json", str(tmp_path / "dry.json"))
    assert dry.returncode == 0, dry.stderr
    assert {r["action"] for r in json.loads((tmp_path / "dry.json").read_text())["ledger"]} == {Action.WOULD_REMOVE}
    assert _listed(sdk, name) and len(ledger.entries()) == 2  # a dry run removes nothing
    done = cleanup(sdk_name, "--json", str(tmp_path / "report.json"))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())["ledger"]
    assert {(r["name"], r["action"]) for r in report} == {(name, Action.TERMINATED), (pool, Action.DELETED)}
    assert not _listed(sdk, name) and not _pool_listed(sdk, pool)
    assert ledger.entries() == []


@pytest.mark.parametrize("sdk_name", KILLED_OWNER_SDKS)
def test_a_terminate_that_failed_twice_is_reaped_after_its_owner_died(
    sdk_name: str, tmp_path: Path, ledger: Ledger, images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's terminate fails twice (two API attempts, both refused by its SDK), then the
    owner is killed: the ledger still says the sandbox runs, and the next start reaps it."""
    sdk = load_sandbox_sdk(sdk_name)
    pool = _pool()
    monkeypatch.setenv("OSMOSIS_HARBOR_API_ATTEMPTS", "2")
    owner, name = start_owner(sdk_name, tmp_path, images[sdk_name], pool, fail_terminate=True)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    [entry] = [e for e in ledger.entries() if e.kind is Kind.SANDBOX]
    assert entry.state is State.TERMINATE_FAILED and "unavailable" in (entry.last_error or "")
    assert _listed(sdk, name)  # positive control: the failed terminate left it running
    monkeypatch.setenv("OSMOSIS_HARBOR_API_ATTEMPTS", "5")
    reaped = reap_dead_owners(sdk_name, settings.current())  # what HarborBackend's start runs
    assert {(r.name, r.action) for r in reaped} == {(name, Action.TERMINATED), (pool, Action.DELETED)}
    assert not _listed(sdk, name) and not _pool_listed(sdk, pool) and ledger.entries() == []


async def _eventually(predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll ``predicate`` while the event loop runs (the background retry runs on it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _refuse_terminate(handle: Any, monkeypatch: pytest.MonkeyPatch, refusals: dict[str, int]) -> None:
    """The handle's terminate refused ``refusals["left"]`` times as an unavailable API would."""
    real = handle.terminate

    class Refusing:
        async def aio(self, *args: Any, **kwargs: Any) -> Any:
            if refusals["left"]:
                refusals["left"] -= 1
                raise ConnectionError("injected: the sandbox API is unavailable")
            return await real.aio(*args, **kwargs)

    monkeypatch.setattr(type(handle), "terminate", property(lambda self: Refusing()))


@pytest.mark.parametrize("sdk_name", OWNER_RETRY_SDKS)
async def test_a_failed_terminate_is_never_forgotten_and_retried_in_the_background(
    sdk_name: str, tmp_path: Path, ledger: Ledger, images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sdk = load_sandbox_sdk(sdk_name)
    monkeypatch.setenv("OSMOSIS_HARBOR_API_ATTEMPTS", "1")  # before the owner: it reads its settings when made
    owner = SandboxOwner.make("test", config=settings.current())
    sandboxes = owner.sandboxes
    with owner_scope(owner):
        env = environment_for(sdk_name, tmp_path, images[sdk_name])
    await env.start(force_build=False)
    name, refusals = env.sandbox_name, {"left": 2}
    try:
        _refuse_terminate(env.sandbox, monkeypatch, refusals)
        await env.stop(delete=True)
        # Still registered, still in the ledger, still running: not forgotten.
        assert sandboxes.registered(name) and _listed(sdk, name)
        [entry] = ledger.entries()
        assert (entry.name, entry.state) == (name, State.TERMINATE_FAILED)
        await _eventually(lambda: not sandboxes.registered(name), "the background retry")
        assert refusals["left"] == 0  # it was refused once more, then got through
    finally:
        await sandboxes.terminate_all()
    assert not _listed(sdk, name) and ledger.entries() == []


@pytest.mark.parametrize("sdk_name", OWNER_RETRY_SDKS)
async def test_the_shutdown_sweep_removes_a_sandbox_whose_terminate_kept_failing(
    sdk_name: str, tmp_path: Path, ledger: Ledger, images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sdk = load_sandbox_sdk(sdk_name)
    monkeypatch.setenv("OSMOSIS_HARBOR_API_ATTEMPTS", "1")  # before the owner: it reads its settings when made
    owner = SandboxOwner.make("test", config=settings.current())
    sandboxes = owner.sandboxes
    with owner_scope(owner):
        env = environment_for(sdk_name, tmp_path, images[sdk_name])
    await env.start(force_build=False)
    name, refusals = env.sandbox_name, {"left": 10**6}
    try:
        _refuse_terminate(env.sandbox, monkeypatch, refusals)
        await env.stop(delete=True)
        failures = await sandboxes.terminate_all()  # the API still refuses: reported, kept
        assert [f.split(":")[0] for f in failures] == [name]
        assert sandboxes.registered(name) and [e.name for e in ledger.entries()] == [name]
        refusals["left"] = 0  # the API is back
        assert await sandboxes.terminate_all() == []
    finally:
        refusals["left"] = 0
        await sandboxes.terminate_all()
    assert not sandboxes.registered(name) and not _listed(sdk, name) and ledger.entries() == []


async def test_a_live_owners_sandbox_is_left_alone(ledger: Ledger, images: dict[str, str], tmp_path: Path) -> None:
    with owner_scope(SandboxOwner.make("test", config=settings.current())):
        env = environment_for("skypilot-emulator", tmp_path, images["skypilot-emulator"])
    await env.start(force_build=False)
    try:
        assert reap_dead_owners("skypilot-emulator", settings.current()) == []
        assert [e.name for e in ledger.entries()] == [env.sandbox_name]
        assert _listed(load_sandbox_sdk("skypilot-emulator"), env.sandbox_name)
    finally:
        await env.stop(delete=True)
    assert ledger.entries() == []


def test_the_next_backend_start_reaps_what_a_dead_owner_left(
    tmp_path: Path, ledger: Ledger, images: dict[str, str]
) -> None:
    sdk = load_sandbox_sdk("skypilot-emulator")
    pool = _pool()
    owner, name = start_owner("skypilot-emulator", tmp_path, images["skypilot-emulator"], pool)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert _listed(sdk, name) and _pool_listed(sdk, pool) and len(ledger.entries()) == 2  # positive control
    # The oracle is not trainable: its warning may already have been shown once in this process.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotTrainableWarning)
        HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=TASKS,
            task_mode="dataset",
            agent="oracle",
            environment_config=environment_config("skypilot-emulator"),
            trials_dir=tmp_path / "trials",
        )
    assert not _listed(sdk, name) and not _pool_listed(sdk, pool) and ledger.entries() == []


CLAIMER = """
import asyncio, sys
from osmosis_harbor import settings
from osmosis_harbor.sandbox import load_sandbox_sdk
from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes
SDK, POOL, NAME = sys.argv[1:4]

async def main():
    sandboxes, sdk = OwnedSandboxes(config=settings.current()), load_sandbox_sdk(SDK)
    await sandboxes.pending(NAME, sdk, SDK)  # in the shared ledger, under this live process
    await sandboxes.attach(NAME, await sdk.create.aio(name=NAME, pool=POOL, timeout=600))
    print(NAME, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _dead_owner() -> OwnerProcess:
    """The owner record of a process that has exited (as a crashed server's would read)."""
    script = "from osmosis_harbor.owner_process import OwnerProcess; print(OwnerProcess.current().model_dump_json())"
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    owner = OwnerProcess.model_validate_json(out.stdout)
    assert owner.is_dead()
    return owner


async def test_a_pool_a_live_owners_sandbox_holds_stays_in_the_ledger_for_the_next_start(
    ledger: Ledger, images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SkyPilot refuses delete_pool (500) while a sandbox claimed from it exists. A shutdown
    terminates its own members, never a live process's: the refused pool is reported and marked
    in the ledger, and once that process is gone the next start (``reap_dead_owners``) ends its
    sandbox and then deletes the pool."""
    monkeypatch.setenv("OSMOSIS_HARBOR_API_ATTEMPTS", "2")
    sdk_name, image, pool = "skypilot-emulator", images["skypilot-emulator"], _pool()
    sandboxes = OwnedSandboxes(config=settings.current())
    sandboxes.process = _dead_owner()  # the pool's owner is a server that will not come back
    await pools.create(sandboxes, sdk_name, pool, image, 1, {})
    mine = await load_sandbox_sdk(sdk_name).create.aio(name=f"hb-ledger-{uuid.uuid4().hex[:6]}", pool=pool, timeout=600)
    await sandboxes.pending(mine.name, load_sandbox_sdk(sdk_name), sdk_name)  # a member of its own, too
    await asyncio.to_thread(_wait_for_a_member, pool)
    name = f"hb-ledger-{uuid.uuid4().hex[:6]}"
    claimer = subprocess.Popen(
        [sys.executable, "-c", CLAIMER, sdk_name, pool, name],
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert claimer.stdout is not None and claimer.stdout.readline().strip() == name
        problems = await pools.delete(sandboxes, sdk_name, [pool])
        assert len(problems) == 1 and pool in problems[0] and "referenced" in problems[0]
        assert not _listed(load_sandbox_sdk(sdk_name), mine.name)  # its own member was ended first
        assert _listed(load_sandbox_sdk(sdk_name), name) and _pool_listed(load_sandbox_sdk(sdk_name), pool)
        [entry] = [e for e in ledger.entries() if e.kind is Kind.POOL]
        assert entry.state is State.DELETE_FAILED and "PoolInUseError" in (entry.last_error or "")
    finally:
        claimer.send_signal(signal.SIGKILL)
        claimer.wait()
    reaped = reap_dead_owners(sdk_name, settings.current())
    assert [(r.kind, r.name, r.action) for r in reaped] == [
        (Kind.SANDBOX, name, Action.TERMINATED),  # the dead claimer's sandbox first...
        (Kind.POOL, pool, Action.DELETED),  # ...then the pool it held
    ]
    assert not _pool_listed(load_sandbox_sdk(sdk_name), pool) and ledger.entries() == []


def _wait_for_a_member(pool: str) -> None:
    """The pool's refill after the first claim: a member for the claimer to take."""
    from tests.support.common import wait_until

    wait_until(lambda: extensions.get_pool(pool).idle >= 1, timeout=60, what=f"a ready member of {pool}")


def _containers_named(fragment: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [n.lstrip("/") for c in client.api.containers(all=True) for n in c["Names"] if fragment in n]
    finally:
        client.close()


def test_a_sandbox_check_killed_mid_run_leaves_nothing_cleanup_cannot_find(
    ledger: Ledger, images: dict[str, str]
) -> None:
    """``sandbox-check`` records its pools in the ledger before it creates them: killed (SIGTERM)
    while its pool's member runs, it leaves a pool ``cleanup`` finds and removes, members too."""
    checks = ["pool_claim_and_refill", "environment_cancelled_during_create_leaves_nothing"]
    argv = [sys.executable, "-m", "osmosis_harbor", "sandbox-check", "--sdk", "docker", "--image", images["docker"]]
    run = subprocess.Popen(
        argv + [arg for name in checks for arg in ("--check", name)],
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: any(e.kind is Kind.POOL for e in ledger.entries()) or run.poll() is not None,
            timeout=180,
            what="sandbox-check's pool in the ledger",
        )
        assert run.poll() is None, "sandbox-check ended before its pool was recorded"
        [entry] = [e for e in ledger.entries() if e.kind is Kind.POOL]
        assert entry.owner.pid == run.pid and entry.name.startswith("sbchk-")
        prefix = entry.name.split("-pool-")[0]  # the run's own name prefix: sbchk-<hex>
        wait_until(
            lambda: bool(_containers_named(f"ohpool_{entry.name}")) or run.poll() is not None,
            timeout=180,
            what="the pool's member running",
        )
        run.send_signal(signal.SIGSTOP)  # held while the positive control is read
        assert _containers_named(prefix), "the run's pool and sandboxes exist (positive control)"
        run.send_signal(signal.SIGTERM)
        run.send_signal(signal.SIGCONT)
        assert run.wait(timeout=60) == -signal.SIGTERM
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert entry.name in [e.name for e in ledger.entries()]  # what it left, the ledger knows
    done = cleanup("docker")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _containers_named(prefix) == [] and ledger.entries() == []
    assert ledger.pool_users("docker", entry.endpoint, entry.name) == []
