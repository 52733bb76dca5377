"""Prewarm, warm pools, admission control (429), status, cancel and shutdown, through the
real osmosis rollout server with trials in Docker sandboxes."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

import docker
import httpx
import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.prewarm import PrewarmError
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS, make_task, managed_containers, wait_until
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
WF = "rollout_fixtures.workflows"
# A second image this run builds: new to every run (no engine has it cached from an earlier one),
# built by whichever SDK path comes first and found by the other (built once, reused after). The
# mark is a comment: a new environment (its own content hash, image and group) whose layers are
# the template's, so Docker's layer cache makes its build a matter of seconds, not of a download
# of the bundle's dependencies.
OTHER_IMAGE_MARK = uuid.uuid4().hex
OTHER_DOCKERFILE = f"FROM python:3.12-slim\nWORKDIR /workspace\n# new to this run: {OTHER_IMAGE_MARK}\n"


@pytest.fixture(scope="module")
def fake_chat():
    server = FakeChatServer(default_reply="echo osmosis > answer.txt")
    yield server
    server.close()


def backend_for(
    tmp_path: Path,
    *,
    agent: str = "ListWorkflow",
    tasks_dir: Path = TASKS / "template",
    task_mode: str = "template",
    n_concurrent: int = 2,
    sdk: SdkPath = DOCKER,
    **env_kwargs,
) -> HarborBackend:
    extra = {k: env_kwargs.pop(k) for k in list(env_kwargs) if k in {"max_queue_depth"}}
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=n_concurrent),
        tasks_dir=tasks_dir,
        task_mode=task_mode,
        agent=f"{WF}:{agent}",
        code_dir=PROJECT,
        bundles_dir=None,  # the session's cache ($OSMOSIS_HARBOR_BUNDLES, tests/conftest.py)
        environment_config=sdk.environment(**env_kwargs),
        trials_dir=tmp_path / "trials",
        **extra,
    )


def rollout_body(fake_chat: FakeChatServer, rollout_id: str, text: str = "answer", **extra) -> dict:
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": text}],
        "chat_completions_url": fake_chat.base_url,
        "llm_api_key": "sk-prewarm-test-key",
        **extra,
    }


async def test_prewarm_groups_builds_once_and_reuses(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    dataset = tmp_path / "ds"
    for name in ("a", "b", "nested/c"):
        shutil.copytree(TASKS / "template", dataset / name)
    make_task(dataset, "other", dockerfile=OTHER_DOCKERFILE)
    backend = backend_for(tmp_path, tasks_dir=dataset, task_mode="dataset", sdk=sandbox_sdk)
    with pytest.raises(ValueError, match="explicit task ids"):
        await backend.prewarm()
    ids = ["a", "b", "nested/c", "other"]
    stages: list[tuple[str, str]] = []
    first = await backend.prewarm(ids, on_progress=lambda key, stage: stages.append((key, stage)))
    assert first.groups == 2 and first.tasks == 4 and first.failed == 0
    assert first.built + first.reused == 2  # each group's image, made or found
    assert sorted(len(g.task_ids) for g in first.groups_detail) == [1, 3]
    assert all(g.setup_ok and g.image for g in first.groups_detail)
    assert {s for _, s in stages} >= {"image", "setup", "done"}
    # a second backend (as a new process would) builds nothing: every image is reused
    again = backend_for(tmp_path, tasks_dir=dataset, task_mode="dataset", sdk=sandbox_sdk)
    second = await again.prewarm(ids)  # its own owner: it knows no image the first one built
    stats = again.owner.builds.stats
    assert second.built == 0 and second.reused == 2 and stats.built == []
    assert managed_containers(owner_pid=os.getpid()) == []
    assert sandbox_sdk.sandboxes_left() == []


async def test_baked_dependencies_are_used_by_the_next_trial(tmp_path: Path, fake_chat) -> None:
    backend = backend_for(tmp_path)
    report = await backend.prewarm()
    image = report.groups_detail[0].image
    # the image has osmosis-ai and the bundle in the venv already, and the marker a trial checks
    out = docker.from_env().containers.run(
        image,
        [
            "sh",
            "-c",
            "/opt/osmosis/venv/bin/python -c 'import osmosis_ai; print(\"baked\")' && cat /opt/osmosis/bundle.id",
        ],
        remove=True,
    )
    assert out.split() == [b"baked", backend.bundle.key.encode()]
    async with serve(backend) as url, client_for(url) as client:
        result = await client.run_rollout(
            initial_messages=[{"role": "user", "content": "go"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id="baked-1",
            llm_api_key="sk-prewarm-test-key",
            grade=True,
        )
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message


async def test_prewarm_failures_are_recorded_and_refused(
    tmp_path: Path, fake_chat, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = tmp_path / "ds"
    shutil.copytree(TASKS / "template", dataset / "good")
    shutil.copytree(FIXTURES / "broken" / "build-fails", dataset / "bad")
    backend = backend_for(tmp_path, tasks_dir=dataset, task_mode="dataset")
    report = await backend.prewarm(["good", "bad"])
    assert report.failed == 1 and "bad" in report.failed_tasks
    # the failing step, its exit code and its output, not the first 400 characters of one line
    head, *detail = report.failed_tasks["bad"].splitlines()
    assert "docker build failed for" in head and head.endswith("exit code 1")
    # the fixture's second instruction fails; the total counts the steps the image adds after it
    assert re.search(r" at step 2/\d+ \(RUN echo ", head), head
    assert "build-fails fixture: this build fails on purpose" in detail
    assert backend.health()["failed_prewarm_tasks"].keys() == {"bad"}
    async with serve(backend) as url, client_for(url) as client:
        refused = await client.run_rollout(
            initial_messages=[{"role": "user", "content": "x"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id="refused-1",
            llm_api_key="sk-prewarm-test-key",
            metadata={"harbor_task_id": "bad"},
        )
    assert refused.status is RolloutStatus.FAILURE and "failed prewarm" in refused.err_message
    assert refused.err_category is RolloutErrorCategory.VALIDATION_ERROR
    # every task failing means the server must not start (its prewarm lifespan raises), and
    # leaves no temporary directory
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))  # what TMPDIR does for a new process
    only_bad = backend_for(tmp_path, tasks_dir=dataset, task_mode="dataset")
    with pytest.raises(PrewarmError, match="every task") as failed:
        async with only_bad.prewarm_lifespan(["bad"])(None):
            pass
    assert "exit code 1" in str(failed.value) and "this build fails on purpose" in str(failed.value)
    assert list(tmpdir.glob("osmosis-harbor-*")) == []  # even before (or without) a shutdown
    await only_bad.shutdown()
    assert list(tmpdir.glob("osmosis-harbor-*")) == []


async def test_systemic_prewarm_failure_raises(tmp_path: Path) -> None:
    """A registry nobody listens on is systemic: said as such (not as "every task failed",
    which a broken task gives: see above), naming the registry."""
    backend = backend_for(tmp_path, registry="127.0.0.1:1")  # nothing listens there
    with pytest.raises(PrewarmError, match="prewarm failed for a systemic reason") as info:
        await backend.prewarm()
    assert "127.0.0.1:1" in str(info.value) and "every task" not in str(info.value)


async def test_server_with_prewarm_lifespan_serves_from_a_warm_pool_and_its_shutdown_removes_a_held_member(
    tmp_path: Path, fake_chat, sandbox_sdk: SdkPath
) -> None:
    """Two rollouts claim pre-started members of the pool the server's prewarm made. Then a
    third still runs in a claimed member when the server stops: on SkyPilot delete_pool answers
    500 while that member exists, so the shutdown terminates it first, the pool goes too and
    the ledger keeps nothing. (``FailingWorkflow`` runs the scripted command, or sleeps for a
    prompt ending in ``fail: sleep``.) The rollouts are ungraded: a graded one's tests claim a
    member of their own, and the pool refills it, for a reward that the next test's pool-served
    rollout asserts."""
    sandbox_sdk.require_loopback_endpoint()
    base = f"warm{uuid.uuid4().hex[:6]}"
    backend = backend_for(tmp_path, agent="FailingWorkflow", pool=base, pool_size=2, sdk=sandbox_sdk)
    async with serve(backend, lifespan=backend.prewarm_lifespan()) as url, client_for(url) as client:
        pools = backend.health()["pools"]
        assert len(pools) == 1
        ((pool_name, state),) = pools.items()
        # SkyPilot's SDK shows no pool: health says so, and the engine tells the test
        expected = {"state": "not reported by this SDK"} if sandbox_sdk.is_emulator else {"replicas": 2}
        assert pool_name.startswith(base) and expected.items() <= state.items()
        assert docker_sdk.get_pool(pool_name).replicas == 2
        wait_until(lambda: docker_sdk.get_pool(pool_name).idle == 2, timeout=60, what="pool to fill")
        idle_before = {c["Id"] for c in managed_containers() if pool_name in str(c["Labels"])}
        results = await asyncio.gather(
            *(
                client.run_rollout(
                    initial_messages=[{"role": "user", "content": "go"}],
                    chat_completions_url=fake_chat.base_url,
                    rollout_id=f"pool-{i}",
                    llm_api_key="sk-prewarm-test-key",
                    grade=False,
                )
                for i in range(2)
            )
        )
        assert all(r.status is RolloutStatus.SUCCESS and r.sample.reward is None for r in results), results
        assert backend.starts.claims[pool_name] == 2 and backend.health()["pool_fallbacks"] == 0
        await backend.owner.settled()  # a result does not wait for its sandbox to go; the claimed members are gone now
        # both trials ran in containers that were idle pool members before traffic
        refilled = wait_until(lambda: docker_sdk.get_pool(pool_name).idle == 2, timeout=60, what="refill")
        assert refilled
        used = idle_before - {c["Id"] for c in managed_containers() if pool_name in str(c["Labels"])}
        assert len(used) == 2, "each rollout claims one pre-started pool member"
        async with httpx.AsyncClient(base_url=url) as http:
            held = await http.post(
                "/rollout", json=rollout_body(fake_chat, "held-member", "go\nfail: sleep", grade=False)
            )
            assert held.status_code == 202, held.text
        await asyncio.to_thread(
            wait_until, lambda: docker_sdk.get_pool(pool_name).claimed == 1, timeout=120, what="a member claimed"
        )
    # the server's shutdown called backend.shutdown(): the held member, the pool and its members are gone
    assert backend.rollout_status("held-member")["status"] == RolloutStatus.CANCELLED
    assert [c for c in managed_containers() if pool_name in str(c["Labels"])] == []
    with pytest.raises(docker_sdk.PoolNotFoundError):
        docker_sdk.get_pool(pool_name)
    assert sandbox_sdk.sandboxes_left() == [] and managed_containers(owner_pid=os.getpid()) == []
    assert [e for e in backend.owner.sandboxes.ledger.entries() if e.name == pool_name] == []


async def test_queue_depth_429_status_and_cancel(tmp_path: Path, fake_chat) -> None:
    backend = backend_for(tmp_path, agent="SleepyWorkflow", n_concurrent=1, max_queue_depth=1)
    async with serve(backend) as url, httpx.AsyncClient(base_url=url) as http:
        first = await http.post("/rollout", json=rollout_body(fake_chat, "slow-running", grade=False))
        assert first.status_code == 202

        def wait_until_status(rid: str, status: RolloutStatus) -> bool:
            state = backend.rollout_status(rid)
            return bool(state) and state["status"] == status

        await asyncio.to_thread(
            wait_until,
            lambda: wait_until_status("slow-running", RolloutStatus.RUNNING),
            timeout=120,
            what="first rollout running",
        )
        second = await http.post("/rollout", json=rollout_body(fake_chat, "slow-queued", grade=False))
        assert second.status_code == 202
        assert backend.rollout_status("slow-queued")["status"] == RolloutStatus.QUEUED
        third = await http.post("/rollout", json=rollout_body(fake_chat, "rejected", grade=False))
        assert third.status_code == 429 and third.headers["Retry-After"] == "5"
        assert backend.rollout_status("rejected") is None
        status = await http.get("/rollout/slow-running/status")
        assert status.status_code == 200 and status.json()["status"] == "running"
        await asyncio.to_thread(
            wait_until,
            lambda: len(managed_containers(owner_pid=os.getpid())) == 1,
            timeout=60,
            what="the running rollout's sandbox",
        )

        cancelled = await http.post("/rollout/cancel", json={"ids": ["slow-queued"]})
        assert cancelled.json()["dispositions"] == {"slow-queued": "cancelled_queued"}
        cancelled = await http.post("/rollout/cancel", json={"prefix": "slow-run"})
        assert cancelled.json()["dispositions"] == {"slow-running": "cancelled_running"}
        await asyncio.to_thread(
            wait_until,
            lambda: backend.rollout_status("slow-running")["status"] == RolloutStatus.CANCELLED,
            timeout=60,
            what="running rollout cancelled",
        )
        assert backend.rollout_status("slow-queued")["status"] == RolloutStatus.CANCELLED
        await asyncio.to_thread(
            wait_until,
            lambda: managed_containers(owner_pid=os.getpid()) == [],
            timeout=60,
            what="cancelled sandbox removed",
        )
        assert backend.health()["in_flight"] == 0


async def test_a_burst_of_admissions_never_overshoots_the_queue_depth(tmp_path: Path, fake_chat) -> None:
    backend = backend_for(tmp_path, agent="SleepyWorkflow", n_concurrent=1, max_queue_depth=2)
    async with serve(backend) as url, httpx.AsyncClient(base_url=url) as http:
        responses = await asyncio.gather(
            *(http.post("/rollout", json=rollout_body(fake_chat, f"burst-{i}", grade=False)) for i in range(8))
        )
        codes = sorted(r.status_code for r in responses)
        # one rollout takes the only trial slot as soon as it starts; two more may wait
        assert codes.count(202) <= 3 and codes.count(429) >= 5, codes
        assert all(r.headers["Retry-After"] == "5" for r in responses if r.status_code == 429)
        accepted = [f"burst-{i}" for i, r in enumerate(responses) if r.status_code == 202]
        await asyncio.to_thread(
            wait_until,
            lambda: all(backend.rollout_status(r) for r in accepted),
            timeout=60,
            what="accepted rollouts to reach the backend",
        )
        statuses = [backend.rollout_status(r)["status"] for r in accepted]
        assert statuses.count(RolloutStatus.QUEUED) <= 2, statuses
        await http.post("/rollout/cancel", json={"all": True})
    assert managed_containers(owner_pid=os.getpid()) == []


async def test_shutdown_with_trials_in_flight_leaves_no_sandbox(tmp_path: Path, fake_chat) -> None:
    backend = backend_for(tmp_path, agent="SleepyWorkflow", n_concurrent=2)
    async with serve(backend) as url, httpx.AsyncClient(base_url=url) as http:
        for i in range(3):
            assert (
                await http.post("/rollout", json=rollout_body(fake_chat, f"inflight-{i}", grade=False))
            ).status_code == 202
        await asyncio.to_thread(
            wait_until,
            lambda: len(managed_containers(owner_pid=os.getpid())) == 2,
            timeout=120,
            what="two sandboxes running",
        )
        assert backend.health()["running"] == 2 and backend.health()["queued"] == 1
    # leaving serve() stops the server, which drains and calls backend.shutdown()
    assert managed_containers(owner_pid=os.getpid()) == []
    assert backend.health()["status"] == "shutting_down" and not backend.has_capacity()


async def _run(client, fake_chat: FakeChatServer, rollout_id: str, *, grade: bool = True):
    return await client.run_rollout(
        initial_messages=[{"role": "user", "content": "go"}],
        chat_completions_url=fake_chat.base_url,
        rollout_id=rollout_id,
        llm_api_key="sk-prewarm-test-key",
        grade=grade,
    )


async def test_a_burst_larger_than_the_warm_pool_runs_every_rollout(
    tmp_path: Path, fake_chat, sandbox_sdk: SdkPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three rollouts at once on a pool of one. On SkyPilot (the strict emulator) a claim with
    no ready member fails: here the refills never warm in time, so two claims wait their bounded
    while and cold-create the pool's image, counted in health(); the Docker SDK starts members
    itself. Every rollout succeeds either way. Ungraded: a graded rollout's tests would claim a
    fresh verifier's sandbox too, a claim like the agent's (a pool-served verifier: the next test)."""
    sandbox_sdk.require_loopback_endpoint()
    monkeypatch.setenv("OSMOSIS_HARBOR_POOL_CLAIM_WAIT_SEC", "0.5")
    backend = backend_for(tmp_path, pool=f"burst{uuid.uuid4().hex[:6]}", pool_size=1, n_concurrent=3, sdk=sandbox_sdk)
    await backend.prewarm()
    if sandbox_sdk.emulator is not None:
        sandbox_sdk.emulator.knobs(pool_warm_sec=600)  # a refill takes longer than the burst
    try:
        async with serve(backend) as url, client_for(url) as client:
            results = await asyncio.gather(
                *(_run(client, fake_chat, f"burst-{i}-{uuid.uuid4().hex[:4]}", grade=False) for i in range(3))
            )
            fallbacks = backend.health()["pool_fallbacks"]
    finally:
        if sandbox_sdk.emulator is not None:
            sandbox_sdk.emulator.knobs(pool_warm_sec=0)
    assert all(r.status is RolloutStatus.SUCCESS and r.sample.reward is None for r in results), results
    # three claims (each rollout's sandbox) on one ready member: two cold-create
    assert fallbacks == (2 if sandbox_sdk.is_emulator else 0)
    assert sandbox_sdk.sandboxes_left() == [] and managed_containers(owner_pid=os.getpid()) == []


async def test_a_second_backend_adopts_the_pool_and_the_first_ones_shutdown_leaves_it(
    tmp_path: Path, fake_chat, sandbox_sdk: SdkPath
) -> None:
    """Two backends in one process prewarm one pool (pool names are shared warm capacity), the
    second as a restarted server would: it meets the pool the first made (on SkyPilot
    create_pool raises for an existing name) and adopts and resizes it, not a "failed prewarm"
    that refuses every rollout of the group. The first's shutdown leaves the pool while the second
    uses it (the ledger's pool users), the second's next rollout claims from it, and its
    shutdown, the last user's, deletes it."""
    sandbox_sdk.require_loopback_endpoint()
    base = f"shared{uuid.uuid4().hex[:6]}"
    first = backend_for(tmp_path / "first", pool=base, pool_size=1, sdk=sandbox_sdk)
    second = backend_for(tmp_path / "second", pool=base, pool_size=2, sdk=sandbox_sdk)
    ledger = second.owner.sandboxes.ledger
    try:
        await first.prewarm()
        report = await second.prewarm()
        (group,) = report.groups_detail
        pool = group.pool
        assert group.error is None and second.health()["failed_prewarm_tasks"] == {}
        assert (group.pool_note or "").startswith("adopted the existing pool") is sandbox_sdk.is_emulator
        assert set(first.prewarmed.task_pools.values()) == set(second.prewarmed.task_pools.values()) == {pool}
        assert docker_sdk.get_pool(pool).replicas == 2  # resized as the second one asked
        users = {u.user for u in ledger.pool_users(sandbox_sdk.name, _endpoint(sandbox_sdk.name), pool)}
        assert users == {first.owner.sandboxes.user, second.owner.sandboxes.user}
        await first.shutdown()
        assert docker_sdk.get_pool(pool).replicas == 2  # still there: the second uses it
        async with serve(second) as url, client_for(url) as client:
            await asyncio.to_thread(
                wait_until, lambda: docker_sdk.get_pool(pool).idle == 2, timeout=120, what="ready members"
            )
            result = await _run(client, fake_chat, f"after-first-{uuid.uuid4().hex[:6]}")
            assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message
            # served by the pool: the agent's sandbox and its tests' fresh one (the task's verifier)
            assert second.starts.claims[pool] == 2 and second.health()["pool_fallbacks"] == 0
    finally:
        await second.shutdown()
        await first.shutdown()  # its pool is gone already: nothing left to do, nothing reported
    with pytest.raises(docker_sdk.PoolNotFoundError):
        docker_sdk.get_pool(pool)
    assert [e for e in ledger.entries() if e.name == pool] == []
    assert ledger.pool_users(sandbox_sdk.name, _endpoint(sandbox_sdk.name), pool) == []
    assert sandbox_sdk.sandboxes_left() == []


def _endpoint(sdk_name: str) -> str:
    from osmosis_harbor.sandbox.ledger.store import endpoint_for

    return endpoint_for(sdk_name, settings.current())
