"""Shutdown delivers what it finished: SIGTERM to a real server process (``serve``) with
rollouts in Docker sandboxes, observed by the osmosis controller client.

The workflows' duration is the test's: each one blocks on its policy call until the test
opens that rollout's gate (``GatedPolicy``), so "about to finish" and "would run past the
grace period" are states the test sets, not timings it hopes for.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import (
    POLLING_LEASE_HEADER,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    RolloutStatus,
)

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.serving.drain import DrainPolicy
from osmosis_harbor.serving.server import draining_server
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, REPO, TASKS, await_until, managed_containers, wait_until
from tests.support.rollout_server import http_to
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = pytest.mark.slow

GRACE_SEC = 20.0  # (a) is graded in a fresh sandbox after the signal: room for that on 2 loaded cores
DELIVERY_SEC = 60.0  # long, so that exiting well before it shows the drain ends on delivery
KEY = "sk-shutdown-test-key"


@dataclass
class GatedPolicy(FakeChatServer):
    """The scripted policy, except that a request whose prompt says ``gate: NAME`` is
    answered only once the test opens that gate."""

    gates: defaultdict[str, threading.Event] = field(default_factory=lambda: defaultdict(threading.Event))

    def reply_for(self, messages: list[dict[str, Any]]) -> str:
        for line in str(messages[-1].get("content", "")).splitlines():
            if line.startswith("gate:"):
                self.gates[line.removeprefix("gate:").strip()].wait(timeout=300)
        return super().reply_for(messages)

    def gated(self) -> set[str]:
        """Gates some request is waiting at (or has passed)."""
        return {
            line.removeprefix("gate:").strip()
            for r in self.requests
            for line in str(r.body["messages"][-1]["content"]).splitlines()
            if line.startswith("gate:")
        }

    def close(self) -> None:
        for gate in list(self.gates.values()):
            gate.set()
        super().close()


@pytest.fixture(scope="module")
def bundles(bundles_dir: Path) -> Path:
    """The session's bundle cache: the workflow wheel is built once per run."""
    return bundles_dir


@pytest.fixture
def policy() -> Iterator[GatedPolicy]:
    server = GatedPolicy(default_reply="echo osmosis > answer.txt")
    yield server
    server.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_process(tmp_path: Path, pool: str, bundles: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m tests.support.shutdown_server`` on a free port; yields it and its URL once it serves
    (prewarm done). Its temporary files go to ``tmp_path/tmp``; kills it if a test fails."""
    port = _free_port()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "home").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "TMPDIR": str(tmp_path / "tmp"),
        "HOME": str(tmp_path / "home"),
    }
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.shutdown_server",
            "--port",
            str(port),
            "--pool",
            pool,
            "--grace",
            str(GRACE_SEC),
            "--delivery",
            str(DELIVERY_SEC),
            "--work",
            str(tmp_path / "work"),
            "--bundles",
            str(bundles),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert proc.poll() is None, f"server exited with {proc.returncode}: {(tmp_path / 'server.log').read_text()}"
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(serving, timeout=300, what="the server to prewarm and serve")
        yield proc, url
    finally:
        if proc.poll() is None:  # the test failed: leave nothing of the killed server behind
            proc.kill()
            proc.wait()
            docker_sdk.remove_all(owner_pid=proc.pid)  # its sandboxes and the pools it made
        log.close()


def _rollout(policy: GatedPolicy, rollout_id: str, gate: str) -> dict[str, Any]:
    return {
        "initial_messages": [{"role": "user", "content": f"Write the answer.\ngate: {gate}"}],
        "chat_completions_url": policy.base_url,
        "rollout_id": rollout_id,
        "llm_api_key": KEY,
    }


async def test_sigterm_delivers_finished_and_cancelled_results_then_exits(
    tmp_path: Path, policy: GatedPolicy, bundles: Path
) -> None:
    pool = f"drain{uuid.uuid4().hex[:6]}"
    with server_process(tmp_path, pool, bundles) as (proc, url):
        client = RolloutClient(url=url)
        async with http_to(url) as http:
            pools = list((await http.get("/health")).json()["pools"])
            assert len(pools) == 1 and pools[0].startswith(pool)
            finishing = await client.run_rollout_async(**_rollout(policy, "finishing", "finishing"))
            overrunning = await client.run_rollout_async(**_rollout(policy, "overrunning", "overrunning"))

            # both workflows now wait for their policy reply, inside their sandboxes
            async def both_waiting() -> bool:
                return policy.gated() == {"finishing", "overrunning"}

            await await_until(both_waiting, timeout=180, what="both workflows to call the policy")
            assert len(managed_containers(owner_pid=proc.pid)) >= 2

            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            health = await await_until(lambda: _draining_health(http), timeout=10, what="health to say draining")
            assert health["lifecycle"]["accepting_rollouts"] is False
            assert health["drain"]["grace_sec"] == GRACE_SEC and health["drain"]["in_flight"] == 2

            refused = await http.post("/rollout", json=_rollout(policy, "too-late", "never"))
            assert refused.status_code == 503, refused.text
            assert 1 <= int(refused.headers["Retry-After"]) <= GRACE_SEC + DELIVERY_SEC
            assert "draining" in refused.json()["detail"]
            assert (await http.get("/rollout/too-late/status")).status_code == 404

            policy.gates["finishing"].set()  # (a) finishes within the grace period
            done = await finishing  # graded, not cancelled: it finished inside the grace period
            assert done.status is RolloutStatus.SUCCESS and done.sample.reward == 1.0, done

            cut = await overrunning  # (b) runs past it
            assert cut.status is RolloutStatus.CANCELLED, cut
            assert "shutdown" in cut.err_message and f"{GRACE_SEC:g} s" in cut.err_message, cut.err_message
            assert time.monotonic() - signalled >= GRACE_SEC  # a deadline: never cut before the grace ends
        await client.aclose()

        # everything was delivered: the server exits on its own, well before the delivery window ends
        returncode = await asyncio.to_thread(proc.wait, DELIVERY_SEC / 2)
    log = (tmp_path / "server.log").read_text()
    assert returncode == 0, log
    assert "1 rollout(s) cancelled at the end of the grace period, 0 result(s) never polled" in log, log
    assert managed_containers(owner_pid=proc.pid) == []
    with pytest.raises(docker_sdk.PoolNotFoundError):
        docker_sdk.get_pool(pools[0])
    assert [c for c in managed_containers() if pool in str(c["Labels"])] == []
    assert list((tmp_path / "tmp").iterdir()) == [], "the backend's temporary root is removed"


async def _draining_health(http: httpx.AsyncClient) -> dict[str, Any] | None:
    payload = (await http.get("/health")).json()
    return payload if payload["status"] == "draining" else None


@DOCKER_PATH_ONLY
async def test_backend_shutdown_is_idempotent_and_removes_pools_and_temp_root(
    bundles: Path, sandbox_sdk: SdkPath
) -> None:
    pool = f"idem{uuid.uuid4().hex[:6]}"
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=TASKS / "template",
        agent="rollout_fixtures.workflows:ListWorkflow",
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=bundles,
        environment_config=sandbox_sdk.environment(pool=pool, pool_size=1),
    )
    work_root = backend.trials_dir.parent
    report = await backend.prewarm()
    (pool_name,) = {g.pool for g in report.groups_detail}
    assert docker_sdk.get_pool(pool_name).replicas == 1
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await asyncio.gather(backend.shutdown(), backend.shutdown())  # e.g. a drain and the lifespan
        await backend.shutdown()
    assert printed.getvalue() == "", printed.getvalue()  # nothing it could not remove
    with pytest.raises(docker_sdk.PoolNotFoundError):
        docker_sdk.get_pool(pool_name)
    assert not work_root.exists()
    assert managed_containers(owner_pid=os.getpid()) == []
    assert sandbox_sdk.sandboxes_left() == []
    assert backend.health()["status"] == "shutting_down" and not backend.has_capacity()


class GatedBackend(ExecutionBackend):
    """Any osmosis backend: a rollout succeeds once the test opens its gate."""

    def __init__(self) -> None:
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        await self.gates[request.id].wait()
        return ExecutionOutcome(workflow=ExecutionResult(status=RolloutStatus.SUCCESS))


async def test_programmatic_drain_waits_for_unpolled_results_only_until_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the osmosis server saves trajectories there
    backend = GatedBackend()
    port = _free_port()
    server = draining_server(
        create_rollout_server(backend=backend, configure_logging=False),
        port=port,
        shutdown_grace_sec=1.0,
        delivery_sec=1.5,
        log_level="warning",
    )
    serving = asyncio.create_task(server.serve())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

        async def started() -> bool:
            return server.started

        await await_until(started, timeout=30, what="the server to start")
        leases = {}
        for rollout_id in ("polled", "unpolled"):
            admitted = await http.post(
                "/rollout",
                json={
                    "rollout_id": rollout_id,
                    "initial_messages": [{"role": "user", "content": "x"}],
                    "chat_completions_url": "http://127.0.0.1:9/v1",
                },
            )
            assert admitted.status_code == 202, admitted.text
            leases[rollout_id] = admitted.json()["polling_lease_token"]
            backend.gates[rollout_id].set()

        async def both_finished() -> bool:  # before the drain, and nobody polled them yet
            return (await http.get("/health")).json()["lifecycle"]["active_rollouts"] == 0

        await await_until(both_finished, timeout=30, what="both rollouts to finish")
        server.request_drain()
        assert (await http.post("/rollout", json={})).status_code == 503  # refused before validation
        health = (await http.get("/health")).json()
        assert health["status"] == "draining" and health["drain"]["undelivered"] == 2
        polled = await http.get("/rollout/polled/result", headers={POLLING_LEASE_HEADER: leases["polled"]})
        assert polled.json()["status"] == "success"
        report = await server.drain.run()  # the drain the server runs, awaited
    await serving
    assert report.cancelled == [] and report.undelivered == ["unpolled"]
    assert report.seconds >= 2.5, "an unpolled result holds the drain until grace + delivery"


@pytest.mark.parametrize(("grace", "delivery"), [(-1, 10), (30, float("nan")), (30, "10")])
def test_drain_policy_refuses_bad_durations(grace: Any, delivery: Any) -> None:
    with pytest.raises(ValueError, match=r"must be a finite number of seconds >= 0, got"):
        DrainPolicy(grace_sec=grace, delivery_sec=delivery)


async def test_a_second_signal_stops_waiting_and_still_cleans_up(
    tmp_path: Path, policy: GatedPolicy, bundles: Path
) -> None:
    """SIGTERM starts the drain; a second SIGTERM during the grace period stops waiting: the
    process ends by that signal, and the backend still removes its sandboxes and pool."""
    pool = f"twice{uuid.uuid4().hex[:6]}"
    with server_process(tmp_path, pool, bundles) as (proc, url):
        client = RolloutClient(url=url)
        async with http_to(url) as http:
            pools = list((await http.get("/health")).json()["pools"])
            stuck = await client.run_rollout_async(**_rollout(policy, "stuck", "never-opened"))

            async def waiting() -> bool:
                return policy.gated() == {"never-opened"}

            await await_until(waiting, timeout=180, what="the workflow to call the policy")
            assert managed_containers(owner_pid=proc.pid)
            proc.send_signal(signal.SIGTERM)
            await await_until(lambda: _draining_health(http), timeout=10, what="health to say draining")
            proc.send_signal(signal.SIGTERM)  # well inside the 20 s grace: stop waiting
            returncode = await asyncio.to_thread(proc.wait, GRACE_SEC)  # a deadline: sooner than the grace
        stuck.cancel()
        await client.aclose()
    log = (tmp_path / "server.log").read_text()
    assert returncode == -signal.SIGTERM, log  # ended by the second signal
    assert managed_containers(owner_pid=proc.pid) == [], log
    with pytest.raises(docker_sdk.PoolNotFoundError):
        docker_sdk.get_pool(pools[0])


async def test_a_result_whose_lease_expired_is_not_waited_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A rollout whose controller stopped polling (its polling lease expired) holds no drain
    until the delivery deadline: the drain ends as soon as the rest is delivered."""
    monkeypatch.setenv("HOME", str(tmp_path))
    backend = GatedBackend()
    port = _free_port()
    server = draining_server(
        create_rollout_server(
            backend=backend, configure_logging=False, result_wait_timeout_sec=0.2, polling_lease_timeout_sec=0.5
        ),
        port=port,
        shutdown_grace_sec=30.0,
        delivery_sec=60.0,
        log_level="warning",
    )
    serving = asyncio.create_task(server.serve())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

        async def started() -> bool:
            return server.started

        await await_until(started, timeout=30, what="the server to start")
        admitted = await http.post(
            "/rollout",
            json={
                "rollout_id": "abandoned",
                "initial_messages": [{"role": "user", "content": "x"}],
                "chat_completions_url": "http://127.0.0.1:9/v1",
            },
        )
        assert admitted.status_code == 202, admitted.text

        async def lease_expired() -> bool:  # nobody polls: the lease ends the rollout
            return (await http.get("/health")).json()["lifecycle"]["active_rollouts"] == 0

        await await_until(lease_expired, timeout=30, what="the polling lease to expire")
        server.request_drain()
        health = (await http.get("/health")).json()
        assert health["drain"]["undelivered"] == 0, health  # counted as nobody's to collect
        report = await server.drain.run()
    await serving
    assert report.cancelled == [] and report.undelivered == []
    assert report.seconds < 30.0, "the drain waited for a result nobody will poll"  # grace + delivery is 90 s


def _closes_idle_connection_within(port: int, seconds: float) -> bool:
    """One request on a fresh connection, then whether the server closes it while idle."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        assert b"200 OK" in sock.recv(65536)
        deadline = time.monotonic() + seconds
        try:
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                if sock.recv(65536) == b"":  # the rest of the response may come first
                    return True
        except TimeoutError:
            pass
        return False


@pytest.mark.parametrize("keep_alive", [None, 1])
async def test_an_idle_connection_outlives_a_clients_keepalive(
    keep_alive: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client reuses an idle connection for up to httpx's 5 s; a server closing it at the same
    moment makes the next request fail (osmosis-ai's eval run then halts its dispatch). Ours
    keeps idle connections longer; the positive control (1 s) shows the probe sees a close."""
    monkeypatch.setenv("HOME", str(tmp_path))
    port = _free_port()
    options = {} if keep_alive is None else {"timeout_keep_alive": keep_alive}
    app = create_rollout_server(backend=GatedBackend(), configure_logging=False)
    server = draining_server(app, port=port, log_level="warning", **options)
    serving = asyncio.create_task(server.serve())
    try:

        async def started() -> bool:
            return server.started

        await await_until(started, timeout=30, what="the server to start")
        expiry = httpx.Limits().keepalive_expiry or 5.0
        closed = await asyncio.to_thread(_closes_idle_connection_within, port, expiry + 1)
        assert closed is (keep_alive is not None)
    finally:
        server.should_exit = True
        await serving
