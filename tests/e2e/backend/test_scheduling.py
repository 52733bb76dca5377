"""Scheduling for RL training, through the real server, Harbor's real TrialQueue and real Docker
sandboxes: an infra retry overtakes rollouts still queued, and a burst of trials never has more
sandbox starts in flight than the backend's start cap.

The test plays the infrastructure as ``test_lost_sandbox`` does: the workflow waits on a FIFO
in /tmp (which is also how the test knows it runs) and the test kills its container. No sleeps.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from harbor.environments.skypilot import _sanitize_dns_name
from harbor.trial.hooks import TrialHookEvent
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.backend.gate import Lease, Priority, TrialGate
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.prewarm.autoscale import AutoscalePolicy, PoolAutoscaler
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS, await_until, managed_containers, wait_until
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
AGENT_GATE = "/tmp/agent-gate"
BLOCKING_REPLY = f"reply: mkfifo {AGENT_GATE} && read x < {AGENT_GATE} && echo 42 > answer.txt"
QUICK_REPLY = "reply: echo 42 > answer.txt"


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    """The template task graded by the Osmosis grader (no tests of its own)."""
    graded = shutil.copytree(TASKS / "template", tmp_path / "tasks" / "graded")
    shutil.rmtree(graded / "tests")
    return graded


def make_backend(tmp_path: Path, task_dir: Path, queue: TrialQueue, bundles_dir: Path, **kwargs: Any) -> HarborBackend:
    return HarborBackend(
        orchestrator=queue,
        tasks_dir=task_dir,
        task_mode="template",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader="rollout_fixtures.graders:AnswerGrader",
        grader_config="rollout_fixtures.graders:fixture_grader_config",
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        trials_dir=tmp_path / "trials",
        environment_config=environment_config("docker"),
        **kwargs,
    )


async def start(client: Any, fake_chat: FakeChatServer, rollout_id: str, text: str, *, grade: bool = True) -> Any:
    return await client.run_rollout_async(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=fake_chat.base_url,
        rollout_id=rollout_id,
        llm_api_key="sk-scheduling-test",
        label="42",
        grade=grade,
    )


def in_sandbox(container_id: str, *argv: str) -> int:
    api = docker.from_env().api
    try:
        exec_id = api.exec_create(container_id, list(argv))["Id"]
        api.exec_start(exec_id)
        return int(api.exec_inspect(exec_id)["ExitCode"])
    except docker.errors.APIError:  # the container went away while we looked
        return -1


async def waiting_at_gate(backend: HarborBackend, rollout_id: str, *, not_in: frozenset[str] = frozenset()) -> dict:
    """The rollout's running sandbox once its workflow waits at the FIFO."""

    def ready() -> dict | None:
        status = backend.rollout_status(rollout_id)
        if not status or not status.get("trial_name"):
            return None
        name = _sanitize_dns_name(f"hb-{status['trial_name']}__env")
        for container in managed_containers(owner_pid=os.getpid()):
            labels, state = container["Labels"], container["State"]
            if labels.get(L.SANDBOX) == name and state == "running" and container["Id"] not in not_in:
                return container if in_sandbox(container["Id"], "test", "-p", AGENT_GATE) == 0 else None
        return None

    return await asyncio.to_thread(wait_until, ready, timeout=180, what=f"{rollout_id} waiting at {AGENT_GATE}")


# ── retries first ─────────────────────────────────────────────────────────────────────────────


async def test_a_retried_rollout_runs_before_the_rollouts_still_queued(tmp_path, task_dir, fake_chat, bundles_dir):
    """The order trials start in is the subject: the rollouts go ungraded (a graded one's grader
    would start a sandbox of its own beside each agent's, for a verdict nobody reads here)."""
    queue = TrialQueue(n_concurrent=1)
    started: list[str] = []  # trial names, in the order Harbor's queue starts them

    async def on_start(event: TrialHookEvent) -> None:
        started.append(event.trial_name)

    queue.on_trial_started(on_start)
    backend = make_backend(tmp_path, task_dir, queue, bundles_dir, infra_retries=1)
    ids = {k: f"{k}-{uuid.uuid4().hex[:6]}" for k in ("lost", "early", "late")}
    async with serve(backend) as url, client_for(url) as client:
        lost = await start(client, fake_chat, ids["lost"], BLOCKING_REPLY, grade=False)
        first = await waiting_at_gate(backend, ids["lost"])
        early = await start(client, fake_chat, ids["early"], QUICK_REPLY, grade=False)

        async def queued(n: int) -> bool:
            return backend.gate.waiting == n

        await await_until(lambda: queued(1), timeout=60, what="early queued")
        late = await start(client, fake_chat, ids["late"], QUICK_REPLY, grade=False)
        await await_until(lambda: queued(2), timeout=60, what="late queued")
        assert backend.health()["waiting_for_slot"] == 2
        docker.from_env().api.kill(first["Id"])  # the infrastructure loses the running sandbox
        second = await waiting_at_gate(backend, ids["lost"], not_in=frozenset({first["Id"]}))
        started_before_release = list(started)
        assert in_sandbox(second["Id"], "sh", "-c", f"echo go > {AGENT_GATE}") == 0
        results = {k: await h.wait_for_completion() for k, h in (("lost", lost), ("early", early), ("late", late))}

    for key, result in results.items():
        assert result.status is RolloutStatus.SUCCESS, (key, result.err_message)
    owner = {name: key for key in ids for name in started if name.startswith(ids[key] + "__")}
    # The retry started while both others were still queued, and ahead of them.
    assert [owner[n] for n in started_before_release] == ["lost", "lost"]
    assert [owner[n] for n in started] == ["lost", "lost", "early", "late"]
    assert managed_containers(owner_pid=os.getpid()) == []


async def test_without_the_gate_harbors_queue_would_serve_the_retry_last():
    """Positive control: Harbor's own queue (no gate in front) serves waiters in arrival order,
    so a retry submitted after others queued runs after them: the order the gate changes."""
    queue = TrialQueue(n_concurrent=1)
    order: list[str] = []
    release = asyncio.Event()

    async def trial(name: str) -> None:
        async with queue._semaphore:  # exactly what TrialQueue._run_trial holds around a trial
            order.append(name)
            if name == "first":
                await release.wait()

    async def waiting(n: int) -> bool:
        return len(queue._semaphore._waiters or ()) == n

    async def started_first(names: list[str]) -> bool:
        return names == ["first"]

    running = asyncio.ensure_future(trial("first"))
    await await_until(lambda: started_first(order), timeout=5, what="first running")
    queued = [asyncio.ensure_future(trial(n)) for n in ("early", "late")]
    await await_until(lambda: waiting(2), timeout=5, what="two trials waiting on the queue's semaphore")
    release.set()
    await running
    retry = asyncio.ensure_future(trial("retry"))
    await asyncio.gather(*queued, retry)
    assert order == ["first", "early", "late", "retry"]


async def test_the_gate_serves_retries_first_then_admission_order_and_skips_cancelled_waiters():
    gate = TrialGate(1)
    holder, early, late, gone, retried = (gate.lease() for _ in range(5))
    await holder.acquire()
    order: list[str] = []

    async def wait(name: str, lease: Lease, priority: Priority = Priority.FIRST_ATTEMPT) -> None:
        await lease.acquire(priority)
        order.append(name)
        lease.release()

    waiters = [asyncio.ensure_future(wait(n, lease)) for n, lease in (("late", late), ("gone", gone), ("early", early))]

    async def queued(n: int) -> bool:
        return gate.waiting == n

    await await_until(lambda: queued(3), timeout=5, what="three waiting")
    waiters[1].cancel()  # a rollout cancelled while it waits gives up its place
    retried.requeue()  # a retry (it holds no slot here) queues ahead of everyone
    retry = asyncio.ensure_future(wait("retry", retried, Priority.RETRY))
    holder.release()
    await asyncio.gather(waiters[0], waiters[2], retry)
    # the retry first; then admission order (tickets), not arrival order; the cancelled one never
    assert order == ["retry", "early", "late"]  # early drew its ticket first, though it waited last
    assert gate.holding == 0 and gate.waiting == 0


# ── the start cap ─────────────────────────────────────────────────────────────────────────────


class CountingCreate:
    """The Docker SDK's ``create``, counting calls in flight. A call proceeds once ``crowd``
    calls are in flight together, so a burst really overlaps (or the test times out)."""

    def __init__(self, real: Any, crowd: int) -> None:
        self.real = real
        self.crowd = crowd
        self.in_flight = 0
        self.peak = 0
        self.calls = 0
        self._together = asyncio.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real(*args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= self.crowd:
            self._together.set()
        try:
            await asyncio.wait_for(self._together.wait(), timeout=120)
            return await self.real.aio(*args, **kwargs)
        finally:
            self.in_flight -= 1


async def burst(tmp_path: Path, task_dir: Path, fake_chat: FakeChatServer, bundles_dir: Path, **kwargs: Any):
    """Four rollouts admitted at once with four trial slots; returns the backend and results."""
    backend = make_backend(tmp_path, task_dir, TrialQueue(n_concurrent=4), bundles_dir, **kwargs)
    async with serve(backend) as url, client_for(url) as client:
        handles = [await start(client, fake_chat, f"burst-{i}-{uuid.uuid4().hex[:6]}", QUICK_REPLY) for i in range(4)]
        results = [await h.wait_for_completion() for h in handles]
    return backend, results


async def test_a_burst_never_has_more_creates_in_flight_than_the_start_cap(
    tmp_path, task_dir, fake_chat, bundles_dir, monkeypatch
):
    counting = CountingCreate(docker_sdk.create, crowd=2)
    monkeypatch.setattr(docker_sdk, "create", counting)
    backend, results = await burst(tmp_path, task_dir, fake_chat, bundles_dir, max_concurrent_starts=2)
    assert all(r.status is RolloutStatus.SUCCESS for r in results), [r.err_message for r in results]
    # each graded rollout starts two sandboxes: its agent's and its isolated grader's
    assert counting.calls == 8 and counting.peak == 2
    assert backend.health()["max_concurrent_starts"] == 2
    assert managed_containers(owner_pid=os.getpid()) == []


async def test_without_a_tight_cap_the_same_burst_creates_four_at_once(
    tmp_path, task_dir, fake_chat, bundles_dir, monkeypatch
):
    """Positive control: the burst really starts four sandboxes together when the cap allows it
    (every create waits until four are in flight), so the cap of 2 above is what held it."""
    counting = CountingCreate(docker_sdk.create, crowd=4)
    monkeypatch.setattr(docker_sdk, "create", counting)
    backend, results = await burst(tmp_path, task_dir, fake_chat, bundles_dir)
    assert all(r.status is RolloutStatus.SUCCESS for r in results), [r.err_message for r in results]
    assert counting.calls == 8 and counting.peak >= 4
    assert backend.health()["max_concurrent_starts"] == 8  # the Docker SDK's default


async def test_a_validation_run_bounds_its_own_starts(tmp_path, monkeypatch):
    from osmosis_harbor.tasks.discovery import load_dataset
    from osmosis_harbor.validate import validate_tasks

    for name in ("a", "b", "c"):
        shutil.copytree(TASKS / "template", tmp_path / "ds" / name)
    counting = CountingCreate(docker_sdk.create, crowd=1)
    monkeypatch.setattr(docker_sdk, "create", counting)
    report = await validate_tasks(
        load_dataset(tmp_path / "ds"), environment=environment_config("docker"), n_concurrent=3, max_concurrent_starts=1
    )
    assert report.passed == 3, report.model_dump()
    # each task's agent sandbox and its fresh verifier's, one at a time
    assert counting.calls == 6 and counting.peak == 1
    assert managed_containers(owner_pid=os.getpid()) == []


def test_max_concurrent_starts_is_checked(tmp_path, task_dir, bundles_dir):
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="max_concurrent_starts"):
            make_backend(tmp_path, task_dir, TrialQueue(n_concurrent=1), bundles_dir, max_concurrent_starts=bad)


# ── batch claims ──────────────────────────────────────────────────────────────────────────────


class RecordingCreate:
    """The Docker SDK's ``create``, recording the keyword arguments of every call."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real(*args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return await self.real.aio(*args, **kwargs)


async def test_trials_of_one_pool_starting_together_claim_in_one_call(tmp_path, fake_chat, bundles_dir, monkeypatch):
    # The batch closes when three claims joined (the window is only a backstop here).
    monkeypatch.setenv("OSMOSIS_HARBOR_CLAIM_BATCH_WINDOW_MS", "120000")
    monkeypatch.setenv("OSMOSIS_HARBOR_CLAIM_BATCH_MAX", "3")
    # pool_size="auto" within [3, 3]: prewarm makes three members and the autoscaler keeps them
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_MIN", "3")
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_MAX", "3")
    # The agents' claims starting together are the subject: a fresh verifier's claim comes when its
    # own agent ends, so the tests run in the agent's sandbox here.
    monkeypatch.setenv("OSMOSIS_HARBOR_FRESH_VERIFIER", "0")
    base = f"batch{uuid.uuid4().hex[:6]}"
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=TASKS / "template",
        task_mode="template",
        agent="rollout_fixtures.workflows:ListWorkflow",
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        trials_dir=tmp_path / "trials",
        environment_config=environment_config("docker", pool=base, pool_size="auto"),
    )
    await backend.prewarm()
    (pool,) = set(backend.prewarmed.task_pools.values())
    assert backend.health()["autoscale"][pool]["size"] == 3
    await asyncio.to_thread(wait_until, lambda: docker_sdk.get_pool(pool).idle == 3, timeout=120, what="pool filled")
    recording = RecordingCreate(docker_sdk.create)
    monkeypatch.setattr(docker_sdk, "create", recording)
    async with serve(backend) as url, client_for(url) as client:
        handles = [
            await start(client, fake_chat, f"batch-{i}-{uuid.uuid4().hex[:6]}", "reply: echo osmosis > answer.txt")
            for i in range(3)
        ]
        results = [await h.wait_for_completion() for h in handles]
        assert backend.health()["batch_claims"] == 1
        assert backend.starts.claims[pool] == 3  # what the autoscaler reads
    assert all(r.status is RolloutStatus.SUCCESS for r in results), [r.err_message for r in results]
    claims = [call for call in recording.calls if call.get("pool") == pool]
    assert len(claims) == 1 and claims[0]["num_sandboxes"] == 3, claims
    assert claims[0]["name"].startswith("hb-batch-")
    assert managed_containers(owner_pid=os.getpid()) == []


def test_the_docker_sdk_claims_several_pool_members_in_one_call(docker_sandbox_sdk, sandbox_image):
    sdk = docker_sandbox_sdk
    pool = f"multi{uuid.uuid4().hex[:6]}"
    sdk.create_pool(pool, sandbox_image, replicas=2)
    try:
        idle = {c["Id"] for c in managed_containers() if c["Labels"].get(L.POOL) == pool}
        members = sdk.create(pool=pool, num_sandboxes=3, name=f"{pool}-m")
        try:
            assert [m.name for m in members] == [f"{pool}-m-0", f"{pool}-m-1", f"{pool}-m-2"]
            assert {m.id for m in members} >= idle  # both idle members, and one cold start
            for member in members:
                handle = member.exec("sh", "-c", "echo $HOSTNAME")
                assert handle.wait() == 0
        finally:
            for member in members:
                member.terminate()
        with pytest.raises(ValueError, match="pass pool="):
            sdk.create(image=sandbox_image, num_sandboxes=2)
        with pytest.raises(ValueError, match="num_sandboxes must be"):
            sdk.create(pool=pool, num_sandboxes=0)
        assert sdk.get_pool(pool).claimed == 0
    finally:
        sdk.delete_pool(pool)


# ── pool autoscaling ──────────────────────────────────────────────────────────────────────────


async def test_an_autoscaled_pool_grows_with_the_claim_rate_and_shrinks_when_idle(docker_sandbox_sdk, sandbox_image):
    sdk = docker_sandbox_sdk
    pool = f"auto{uuid.uuid4().hex[:6]}"
    await sdk.create_pool.aio(pool, sandbox_image, replicas=1)
    try:
        now = [0.0]
        claims: dict[str, int] = {pool: 0}
        policy = AutoscalePolicy(min_size=1, max_size=3, idle_sec=60, replace_sec=2.0)
        scaler = PoolAutoscaler(sdk, [pool], claims, policy, initial_size=1, clock=lambda: now[0])

        now[0] = 10.0  # ten quiet seconds: nothing to do
        assert await scaler.tick() == {pool: 1}
        assert sdk.get_pool(pool).replicas == 1

        claims[pool] = 4  # four claims in one second: 0.5 * 4/s smoothed, x 2 s to replace x 1.5
        now[0] = 11.0
        assert scaler.target(pool) == 1  # not observed until the tick
        assert await scaler.tick() == {pool: 3}  # ceil(2 * 2 * 1.5) = 6, within the max of 3
        grown = sdk.get_pool(pool)
        assert grown.replicas == 3 and grown.idle + grown.starting >= 3
        assert 0 < scaler.replace_sec  # measured from the growth call

        claims[pool] = 5  # claims go on, slower: still within the idle time, the pool holds
        now[0] = 40.0
        await scaler.tick()
        assert sdk.get_pool(pool).replicas >= 2  # ceil(~1 claim/s x >= 1 s x 1.5), not the minimum

        now[0] = 40.0 + policy.idle_sec  # a minute without a claim: back to the minimum
        assert await scaler.tick() == {pool: 1}
        assert sdk.get_pool(pool).replicas == 1
        assert scaler.state()[pool]["size"] == 1
    finally:
        await sdk.delete_pool.aio(pool)


def test_pool_size_auto_is_accepted_where_a_size_is():
    config = environment_config("docker", pool="warm", pool_size="auto")
    assert config.kwargs["pool_size"] == "auto"
    with pytest.raises(ConfigError, match="pool_size must be"):
        environment_config("docker", pool="warm", pool_size="big")  # type: ignore[arg-type]
    from osmosis_harbor.cli import build_parser

    args = build_parser().parse_args(["prewarm", str(TASKS / "template"), "--pool", "warm", "--pool-size", "auto"])
    assert args.pool_size == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["prewarm", str(TASKS / "template"), "--pool", "warm", "--pool-size", "many"])
