"""Start-up and /health as osmosis-ai's harness (``osmosis eval run``) reads them: capacity and
reachability in the shape it parses (checked with the harness's own readers), a prewarm the
server serves during, a failed one that stops the server, SIGTERM during it (sent as the harness
sends it), and an emulator server that stops with the backend that started it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from harbor.models.trial.config import EnvironmentConfig
from harbor.trial.queue import TrialQueue
from osmosis_ai.eval.local.runner import health_capacity, public_chat_endpoint_environment
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.backend.admission import requires_public_url
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.sandbox.emulator.client.http import session
from osmosis_harbor.sandbox.emulator.server import launcher
from osmosis_harbor.sandbox.emulator.server.process import read_state
from osmosis_harbor.sandbox.options import IMPORT_PATH, SandboxOptions
from osmosis_harbor.sandbox.sdk.registry import implementation
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, REPO, TASKS, make_task, process_alive, wait_until
from tests.support.rollout_server import client_for, http_to, serve
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
HARNESS_GRACE_SEC = 5.0  # osmosis-ai's _SERVER_TERM_GRACE_SEC: SIGTERM to SIGKILL for its rollout server
AGENT = "rollout_fixtures.workflows:ListWorkflow"


def backend_for(tmp_path: Path, sdk: SdkPath, *, n_concurrent: int = 2, **kwargs) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=n_concurrent),
        tasks_dir=TASKS / "template",
        task_mode="template",
        agent=AGENT,
        code_dir=PROJECT,
        environment_config=kwargs.pop("environment", None) or sdk.environment(),
        trials_dir=tmp_path / "trials",
        **kwargs,
    )


# -- what /health says ---------------------------------------------------------------------------


def test_health_tells_the_harness_capacity_and_reachability(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    """Read with the harness's own functions: as many in flight as the queue runs when
    ``max_queue_depth`` is unset (it fell back to 1), ``max_queue_depth`` when set; no tunnel
    where our relay serves the sandboxes."""
    backend = backend_for(tmp_path, sandbox_sdk, n_concurrent=3)
    health = backend.health()
    assert health["chat_endpoint"] == {"environment": sandbox_sdk.name, "requires_public_url": False}
    assert public_chat_endpoint_environment(health) is None
    assert health_capacity(health) == 3 and health["status"] == "ok" and health["ready"] is True
    bounded = backend_for(tmp_path, sandbox_sdk, n_concurrent=3, max_queue_depth=7)
    assert health_capacity(bounded.health()) == 7


def test_only_sandboxes_that_cannot_reach_this_host_need_a_public_url() -> None:
    def needs(sdk: str, agent: str = AGENT, **kwargs) -> bool:
        options = BackendOptions.parse(
            orchestrator=TrialQueue(n_concurrent=1), tasks_dir=TASKS / "template", task_mode="template", agent=agent
        )
        # built without environment_config(), which would import sky.sandbox (not installed here)
        config = EnvironmentConfig(import_path=IMPORT_PATH, kwargs=SandboxOptions.build(sdk=sdk, **kwargs).to_kwargs())
        return requires_public_url(options, config)

    assert needs("skypilot")  # the harness then opens a tunnel by itself
    assert not needs("docker") and not needs("skypilot-emulator")  # the policy relay
    assert not needs("docker", host_network=True)
    assert not needs("skypilot", agent="oracle")  # it never calls the model
    assert not needs("skypilot", agent="terminus-2")  # its model client runs on this host


# -- a prewarm the server serves during ------------------------------------------------------------


async def _until(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := await predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.1)
    return value


@pytest.mark.slow
@DOCKER_PATH_ONLY  # the server's start-up states; prewarm itself runs on both paths (test_prewarm_and_lifecycle.py)
async def test_background_prewarm_answers_health_and_refuses_until_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox_sdk: SdkPath
) -> None:
    sandbox_sdk.require_loopback_endpoint()
    backend = backend_for(tmp_path, sandbox_sdk)
    held = asyncio.Event()
    real_prewarm = backend.prewarming.prewarm

    async def held_prewarm(*args, **kwargs):
        await held.wait()  # the test decides when the (real) prewarm may run
        return await real_prewarm(*args, **kwargs)

    monkeypatch.setattr(backend.prewarming, "prewarm", held_prewarm)
    policy = FakeChatServer(default_reply="echo osmosis > answer.txt")
    body = {
        "rollout_id": "after-prewarm",
        "initial_messages": [{"role": "user", "content": "go"}],
        "chat_completions_url": policy.base_url,
        "llm_api_key": "sk-startup-test-key",
    }
    try:
        async with serve(backend, lifespan=backend.prewarm_lifespan(background=True)) as url, http_to(url) as http:
            health = (await http.get("/health")).json()
            assert (health["status"], health["ready"], health["startup"]["phase"]) == ("starting", False, "prewarming")
            assert health_capacity(health) == 2  # what the harness sizes its run by, before prewarm ends
            refused = await http.post("/rollout", json=body)
            assert refused.status_code == 429 and refused.headers["Retry-After"]
            held.set()

            async def ready() -> dict | None:
                state = (await http.get("/health")).json()
                return state if state["ready"] else None

            health = await _until(ready, timeout=600, what="prewarm to finish")
            assert health["status"] == "ok" and health["startup"]["phase"] == "ready"
            assert health["startup"]["groups_finished"] == health["startup"]["groups"] == 1
            async with client_for(url) as client:
                result = await client.run_rollout(**{k: v for k, v in body.items()})
            assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message
    finally:
        policy.close()
    assert sandbox_sdk.sandboxes_left() == []


# -- the server as its own process, stopped as the harness stops it ------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def startup_server(tmp_path: Path, tasks: Path, task: str, sdk: SdkPath) -> Iterator[tuple[subprocess.Popen, str]]:
    """``python -m tests.support.startup_server``, in a session of its own as the harness starts its
    rollout server; its temporary files in ``tmp_path/tmp``. Killed with its group if the test
    fails."""
    port = _free_port()
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, **sdk.cli_env(), "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "tests.support.startup_server", "--port", str(port), "--tasks", str(tasks)]
    argv += ["--task", task, "--work", str(tmp_path / "work"), "--sdk", sdk.name]
    with (tmp_path / "server.log").open("w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _health(url: str) -> dict | None:
    try:
        return httpx.get(f"{url}/health", timeout=5).json()
    except httpx.TransportError:
        return None


def _build_containers(marker: str) -> list[str]:
    """The engine's containers running a build step that mentions ``marker``."""
    containers = docker.from_env().api.containers(all=True)
    return [c["Id"] for c in containers if marker in (c.get("Command") or "")]


@pytest.mark.slow
@DOCKER_PATH_ONLY
def test_sigterm_during_background_prewarm_stops_cleanly(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    """The harness stops a rollout server by SIGTERM to its process group, with 5 s before SIGKILL
    (after a failed start-up). Mid-build, the server answers health, then stops by itself within
    that: the build is abandoned (its step's container goes), the prewarm work folder too. Before,
    the stop waited for the build, then built again (the retry swallowed the cancellation).

    On the Docker path: the image is built on this machine's engine on either path, and the stop
    lands before any sandbox or pool exists (the emulator's path would only push the image after
    the build); prewarm with the emulator's pools is ``test_prewarm_and_lifecycle.py``'s."""
    marker = f"slow-{uuid.uuid4().hex[:10]}"
    dataset = tmp_path / "ds"
    make_task(dataset, "slow", dockerfile=f"FROM python:3.12-slim\nRUN echo {marker} && sleep 300\nWORKDIR /app\n")
    with startup_server(tmp_path, dataset, "slow", sandbox_sdk) as (proc, url):
        wait_until(lambda: _build_containers(marker), timeout=300, what="the slow build step to run")
        health = _health(url)
        assert health is not None and health["status"] == "starting" and health["startup"]["stages"]
        assert list((tmp_path / "tmp").glob("osmosis-harbor-prewarm-*"))
        os.killpg(proc.pid, signal.SIGTERM)  # as the harness's terminate_process_group does
        try:
            assert proc.wait(timeout=HARNESS_GRACE_SEC) == 0, (tmp_path / "server.log").read_text()
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {HARNESS_GRACE_SEC} s after SIGTERM, when the harness would SIGKILL it")
        with pytest.raises(ProcessLookupError):  # nothing of its process group is left either
            os.killpg(proc.pid, 0)
    assert list((tmp_path / "tmp").glob("osmosis-harbor-prewarm-*")) == []
    wait_until(lambda: not _build_containers(marker), timeout=60, what="the abandoned build step to go")
    assert sandbox_sdk.sandboxes_left() == []


@pytest.mark.slow
def test_a_failed_background_prewarm_stops_the_server(tmp_path: Path) -> None:
    """The harness then sees the server exit (and resumes later), instead of waiting on 429s."""
    dataset = tmp_path / "ds"
    shutil.copytree(FIXTURES / "broken" / "build-fails", dataset / "bad")
    with startup_server(tmp_path, dataset, "bad", SdkPath("docker")) as (proc, _url):
        assert proc.wait(timeout=300) == 1
    log = (tmp_path / "server.log").read_text()
    assert "osmosis-harbor: prewarm failed, stopping the server: PrewarmError:" in log
    assert "exit code 1" in log and "build-fails fixture: this build fails on purpose" in log
    assert list((tmp_path / "tmp").glob("osmosis-harbor-*")) == []


# -- an emulator server we started --------------------------------------------------------------------


def test_an_emulator_server_stops_with_the_backend_that_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Without OSMOSIS_HARBOR_EMULATOR_URL the first client starts a detached server. The backend
    whose calls started it stops it at shutdown; a server already running when the backend came is
    left running (another process's)."""
    monkeypatch.delenv("OSMOSIS_HARBOR_EMULATOR_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # an account of the test's own
    session().close()  # forget a server this process's SDK client used before
    request.addfinalizer(lambda: session().close())
    state_file = tmp_path / "cache" / "osmosis-harbor" / "emulator" / launcher.STATE_FILE
    sdk = SdkPath("skypilot-emulator")

    backend = backend_for(tmp_path, sdk)
    assert read_state(state_file) is None
    implementation(sdk.name).load().ls()  # the first call of this process starts one
    started = read_state(state_file)
    assert started is not None and process_alive(started.pid)
    asyncio.run(backend.shutdown())
    assert not process_alive(started.pid)

    other = subprocess.run(  # another process starts one and exits: the server outlives it
        [
            sys.executable,
            "-c",
            "from osmosis_harbor import settings; from osmosis_harbor.sandbox.emulator.server import launcher; "
            "print(launcher.server_url(settings.current()))",
        ],
        env={**os.environ},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    running = read_state(state_file)
    assert running is not None and running.url == other.stdout.strip() and process_alive(running.pid)
    try:
        reused = backend_for(tmp_path, sdk)
        implementation(sdk.name).load().ls()
        asyncio.run(reused.shutdown())
        assert process_alive(running.pid)
    finally:
        os.kill(running.pid, signal.SIGTERM)
        wait_until(lambda: not process_alive(running.pid), timeout=30, what="the other server to stop")
