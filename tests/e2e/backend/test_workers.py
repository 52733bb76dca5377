"""``HarborBackend(workers=2)`` end to end: the real osmosis server on 127.0.0.1 in this process
(the front), two worker processes running real trials through their own Harbor ``TrialQueue``s,
on both sandbox paths where it matters; and the refusals of what cannot cross to a worker."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest
from harbor.trial.hooks import TrialEvent
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.backends import PROJECT, WF, make_backend
from tests.support.common import TASKS, await_until, managed_containers
from tests.support.rollout_server import client_for, http_to, serve
from tests.support.sdk_paths import DOCKER, DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

SLEEP = "reply: sleep 300"  # a tag after it goes behind "#": sleep takes no other argument
QUICK = "reply: echo 42 > answer.txt"


@pytest.fixture
def api_key() -> str:
    return f"sk-workers-{uuid.uuid4().hex}"


def workers_backend(tmp_path: Path, bundles_dir: Path, sdk: SdkPath = DOCKER, **kwargs) -> HarborBackend:
    backend = make_backend(tmp_path, bundles_dir, agent="OutputWorkflow", sdk=sdk, workers=2, **kwargs)
    assert backend.front is not None and len(backend.front.handles) == 2
    return backend


def worker_pid(backend: HarborBackend, rollout_id: str) -> int | None:
    assert backend.front is not None
    return backend.front.worker_of(rollout_id)


async def start(client, fake_chat: FakeChatServer, api_key: str, text: str, rollout_id: str):
    return await client.run_rollout_async(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=fake_chat.base_url,
        rollout_id=rollout_id,
        llm_api_key=api_key,
        grade=False,
    )


def asked(fake_chat: FakeChatServer, text: str) -> bool:
    """Whether a workflow asked the policy about ``text``: its sandbox is up and running it."""
    return any(text in str(r.body.get("messages")) for r in list(fake_chat.requests))


def key_in_process(pid: int, key: str) -> list[str]:
    """Where ``key`` shows in what the host exposes of process ``pid`` (argv, environment)."""
    found = []
    for part in ("cmdline", "environ"):
        if key.encode() in Path(f"/proc/{pid}/{part}").read_bytes():
            found.append(part)
    return found


async def succeeded_through_the_front(http, handle, rollout_id: str) -> None:
    """The rollout succeeded, and its status reads back through the front."""
    result = await handle.wait_for_completion()
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    status = (await http.get(f"/rollout/{rollout_id}/status")).json()
    assert status["status"] == "success" and status["task_id"] == "template" and status["trial_name"]


@DOCKER_PATH_ONLY
async def test_a_killed_worker_loses_only_its_rollout(tmp_path, bundles_dir, fake_chat, api_key, sandbox_sdk: SdkPath):
    """Rollouts spread over two workers (least-loaded routing uses both; the key is in neither
    worker's argv, environment or files; status reads back through the front). SIGKILL the worker
    running one rollout: it ends internal_error (status and result), its sandbox is reaped, the
    other worker's rollout succeeds, and a new worker serves the next."""
    sandbox_sdk.require_loopback_endpoint()
    backend = workers_backend(tmp_path, bundles_dir, sandbox_sdk)
    assert backend.front is not None
    pids = {h.pid for h in backend.front.handles}
    doomed, other, after = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("doomed", "other", "after"))
    async with serve(backend) as url, client_for(url) as client, http_to(url) as http:
        sleeping = await start(client, fake_chat, api_key, f"{SLEEP} #{doomed}", doomed)
        await await_until(lambda: asyncio.sleep(0, asked(fake_chat, doomed)), timeout=300, what="the sandbox up")
        quick = await start(client, fake_chat, api_key, QUICK, other)
        victim = worker_pid(backend, doomed)
        assert victim is not None and worker_pid(backend, other) not in (None, victim)
        assert {victim, worker_pid(backend, other)} == pids  # least-loaded routing used both
        for pid in pids:
            assert key_in_process(pid, api_key) == []
        health = (await http.get("/health")).json()
        assert health["workers"]["count"] == 2 and health["concurrency"]["max_concurrent"] == 3
        if not sandbox_sdk.is_emulator:
            assert managed_containers(owner_pid=victim), "the doomed rollout's sandbox is the victim's"
        os.kill(victim, signal.SIGKILL)
        lost = await sleeping.wait_for_completion()
        assert lost.status is RolloutStatus.FAILURE and lost.err_category is RolloutErrorCategory.INTERNAL_ERROR
        assert "died" in lost.err_message
        status = (await http.get(f"/rollout/{doomed}/status")).json()
        assert status["status"] == "failure" and status["err_category"] == "internal_error"
        # reaped before the rollout ended: nothing of the dead worker is left
        assert managed_containers(owner_pid=victim) == []
        await succeeded_through_the_front(http, quick, other)
        # its worker terminates its sandbox after the result (terminations do not hold results)
        await await_until(
            lambda: asyncio.sleep(0, sandbox_sdk.sandboxes_left() == []), timeout=60, what="the sandbox gone"
        )
        await await_until(
            lambda: asyncio.sleep(0, backend.front.restarts == 1 and all(h.alive for h in backend.front.handles)),
            timeout=120,
            what="the dead worker replaced",
        )
        assert victim not in {h.pid for h in backend.front.handles}
        # the replacement takes the next rollout: the least loaded, the other holds one more
        blocker = await start(client, fake_chat, api_key, f"{SLEEP} #blocker-{after}", f"blocker-{after}")
        follow = await start(client, fake_chat, api_key, f"{QUICK} again", after)
        served_by = worker_pid(backend, after)
        assert served_by is not None and served_by != worker_pid(backend, f"blocker-{after}")
        assert key_in_process(served_by, api_key) == []
        await succeeded_through_the_front(http, follow, after)
        await await_until(
            lambda: asyncio.sleep(0, asked(fake_chat, f"blocker-{after}")), timeout=300, what="the blocker up"
        )
        backend.cancel_rollouts(ids=[f"blocker-{after}"])
        assert (await blocker.wait_for_completion()).status is RolloutStatus.CANCELLED
    assert sandbox_sdk.sandboxes_left() == []
    assert managed_containers(owner_pid=victim) == []
    needle = api_key.encode()
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert needle not in path.read_bytes(), f"key in {path}"
    assert not (backend.workspace.root / "workers").exists()


async def test_a_cancelled_execute_status_cancel_and_a_drain_reach_the_owning_workers(
    tmp_path, bundles_dir, fake_chat, api_key, monkeypatch
):
    """One backend with two workers (from the ``OSMOSIS_HARBOR_WORKERS`` setting; prewarm is
    refused for it), each worker with one slot (n_concurrent=2), through four stages:

    - a cancelled execute() (what a drain or an expired lease does): the front has the worker
      stop the trial and waits for it, so the sandbox is gone when the cancellation lands;
    - a running rollout on each worker and a queued third: all show in the front's status, the
      queued and a running one cancel;
    - a new rollout takes the freed worker, so each worker runs one when the backend shuts down:
      both end cancelled, the workers exit, no sandbox and no work directory is left."""
    from osmosis_ai.rollout.context import RolloutContext
    from osmosis_ai.rollout.types import ExecutionRequest

    monkeypatch.setenv("OSMOSIS_HARBOR_WORKERS", "2")
    backend = make_backend(tmp_path, bundles_dir, agent="OutputWorkflow", orchestrator=TrialQueue(n_concurrent=2))
    assert backend.front is not None and backend.front.count == 2
    handles = list(backend.front.handles)
    with pytest.raises(ConfigError, match="prewarm.. is not available with workers=2"):
        await backend.prewarm()

    try:
        drained = f"drained-{uuid.uuid4().hex[:6]}"

        async def execute():
            with RolloutContext(chat_completions_url=fake_chat.base_url, api_key=api_key, rollout_id=drained):
                return await backend.execute(
                    ExecutionRequest(
                        id=drained, prompt=[{"role": "user", "content": f"{SLEEP} #{drained}"}], grade=False
                    )
                )

        task = asyncio.create_task(execute())
        await await_until(
            lambda: asyncio.sleep(0, asked(fake_chat, drained) or task.done()), timeout=300, what="the sandbox up"
        )
        assert not task.done(), task.result().result
        owner = worker_pid(backend, drained)
        assert owner is not None and managed_containers(owner_pid=owner)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert backend.rollout_status(drained)["status"] == "cancelled"
        await await_until(  # its worker terminates it after the cancelled result
            lambda: asyncio.sleep(0, managed_containers(owner_pid=owner) == []), timeout=60, what="the sandbox gone"
        )
        assert backend.health()["in_flight"] == 0

        ids = [f"cancel-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
        async with serve(backend) as url, client_for(url) as client, http_to(url) as http:
            running = [await start(client, fake_chat, api_key, f"{SLEEP} #{ids[i]}", ids[i]) for i in range(2)]
            await await_until(
                lambda: asyncio.sleep(0, asked(fake_chat, ids[0]) and asked(fake_chat, ids[1])),
                timeout=300,
                what="both sleeping workflows running",
            )
            queued = await start(client, fake_chat, api_key, f"{SLEEP} #{ids[2]}", ids[2])
            await await_until(
                lambda: asyncio.sleep(0, backend.rollout_status(ids[2]) is not None), timeout=30, what="queued admitted"
            )
            assert {worker_pid(backend, ids[0]), worker_pid(backend, ids[1])} == {h.pid for h in handles}
            assert (await http.get(f"/rollout/{ids[0]}/status")).json()["status"] == "running"
            assert (await http.get(f"/rollout/{ids[2]}/status")).json()["status"] == "queued"
            assert backend.cancel_rollouts(ids=[ids[2]]) == {ids[2]: "cancelled_queued"}
            assert backend.cancel_rollouts(ids=[ids[0]]) == {ids[0]: "cancelled_running"}
            first, third = await running[0].wait_for_completion(), await queued.wait_for_completion()
            assert first.status is RolloutStatus.CANCELLED and third.status is RolloutStatus.CANCELLED
            assert backend.rollout_status(ids[0])["status"] == "cancelled"

            # the drain: a rollout on each worker (the new one takes the worker ids[0] freed)
            refill = await start(client, fake_chat, api_key, f"{SLEEP} #{ids[3]}", ids[3])
            await await_until(
                lambda: asyncio.sleep(0, asked(fake_chat, ids[3])), timeout=300, what="a rollout on each worker"
            )
            assert {worker_pid(backend, ids[1]), worker_pid(backend, ids[3])} == {h.pid for h in handles}
            assert all(managed_containers(owner_pid=h.pid) for h in handles)
            results = [asyncio.ensure_future(r.wait_for_completion()) for r in (running[1], refill)]
            await backend.shutdown()
            for done in results:
                assert (await done).status is RolloutStatus.CANCELLED
            assert backend.health()["status"] == "shutting_down" and not backend.has_capacity()
    finally:
        await backend.shutdown()  # what a failure above left running
    assert managed_containers(owner_pid=os.getpid()) == []
    for handle in handles:
        assert handle.process.returncode == 0
        assert managed_containers(owner_pid=handle.pid) == []
    assert not (backend.workspace.root / "workers").exists()


def test_orchestrator_hooks_and_unpicklable_options_are_refused_by_name(tmp_path, bundles_dir):
    async def user_hook(event) -> None:
        return None

    queue = TrialQueue(n_concurrent=4)
    queue.add_hook(TrialEvent.END, user_hook)
    with pytest.raises(ConfigError, match=r"orchestrator has hooks \(end: .*user_hook\)"):
        make_backend(tmp_path, bundles_dir, agent="OutputWorkflow", workers=2, orchestrator=queue)
    with pytest.raises(ConfigError, match=r"n_concurrent=1 cannot be shared by 2"):
        make_backend(tmp_path, bundles_dir, agent="OutputWorkflow", workers=2, orchestrator=TrialQueue(n_concurrent=1))
    with pytest.raises(ConfigError, match=r"option workflow_config= cannot cross"):
        HarborBackend(
            orchestrator=TrialQueue(n_concurrent=2),
            tasks_dir=TASKS / "template",
            agent=f"{WF}:OutputWorkflow",
            workflow_config=lambda: None,
            code_dir=PROJECT,
            bundles_dir=bundles_dir,
            workers=2,
        )
    with pytest.raises(ConfigError, match="workers must be"):
        make_backend(tmp_path, bundles_dir, agent="OutputWorkflow", workers=0)


def test_workers_of_a_killed_front_remove_their_sandboxes_and_exit(tmp_path, bundles_dir, fake_chat):
    """The front SIGKILLed with a rollout in each worker's sandbox: the workers see their socket
    close, shut their backends down (the sandboxes go), remove the front's work root and exit."""
    import json
    import subprocess
    import sys

    from tests.support.common import REPO, process_alive, wait_until

    argv = [sys.executable, "-m", "tests.support.workers_front", "--work", str(tmp_path), "--bundles", str(bundles_dir)]
    front = subprocess.Popen([*argv, "--chat", fake_chat.base_url], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = front.stdout.readline()  # once both rollouts run (the trials left the queues)
        started = json.loads(line)
        pids, root = started["workers"], Path(started["root"])
        wait_until(
            lambda: asked(fake_chat, "front-a") and asked(fake_chat, "front-b"), timeout=300, what="both sandboxes up"
        )
        assert all(managed_containers(owner_pid=pid) for pid in pids)
        front.kill()
        front.wait()
        wait_until(lambda: not any(process_alive(pid) for pid in pids), timeout=180, what="the workers gone")
        assert all(managed_containers(owner_pid=pid) == [] for pid in pids)
        assert not root.exists(), sorted(root.rglob("*"))  # the workers removed the dead front's root
    finally:
        front.kill()
        front.wait()
