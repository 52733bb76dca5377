"""The rollout API key never outlives its trial: whatever ends the trial (success, failure,
agent timeout, cancel, shutdown, or a crash of the host process followed by the next
start), no retained file holds the key in any spelling the shim's Redactor knows.

Each rollout runs a workflow that writes its key into ``/logs/agent`` and its artifacts
(raw, JSON-escaped inside a JSON string, URL-encoded) before it ends or blocks, through the
real osmosis server, Harbor's TrialQueue and Docker sandboxes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.key_custody import MARKER, KeyCustody
from osmosis_harbor.serving.server import draining_server
from osmosis_harbor.shim.errors import Redactor
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, REPO, TASKS, await_until, managed_containers
from tests.support.rollout_server import client_for, http_to, serve
from tests.support.sdk_paths import DOCKER, DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
HOARDER = "rollout_fixtures.workflows:KeyHoardingWorkflow"


@pytest.fixture
def api_key() -> str:
    """A key whose JSON-escaped and URL-encoded spellings differ from the raw one."""
    return f'sk-hoard/{uuid.uuid4().hex}+"q"\\ é&x=1'


def hoarding_backend(tmp_path: Path, bundles_dir: Path, sdk: SdkPath = DOCKER, **kwargs) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=kwargs.pop("n_concurrent", 1)),
        tasks_dir=TASKS / "template",
        agent=HOARDER,
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=sdk.environment(),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=False,
        **kwargs,
    )


def spellings(key: str) -> list[bytes]:
    variants = Redactor.for_key(key).secrets
    assert len(variants) == 3, variants  # raw, JSON-escaped, URL-encoded all differ for this key
    return [v.encode() for v in sorted(variants, key=lambda v: v != key)]  # the raw key first


def assert_key_absent(key: str, *roots: Path) -> None:
    for root in roots:
        for path in root.rglob("*"):
            for spelling in spellings(key):
                assert spelling not in path.name.encode(), f"the key names {path}"
                if path.is_file() and not path.is_symlink():
                    assert spelling not in path.read_bytes(), f"the key ({spelling!r}) is in {path}"


def assert_scrubbed_not_lost(key: str, trials: Path) -> None:
    """The hoarded files reached the trial directory (else the test would prove nothing),
    and no spelling of the key is left anywhere: they were scrubbed, not removed."""
    hoards = [p for p in trials.rglob("hoard*") if p.is_file()]
    assert {p.name for p in hoards} >= {"hoard.txt", "hoard.json", "hoard-url.txt"}, hoards
    assert_key_absent(key, trials)
    assert all(b"***" in p.read_bytes() for p in hoards), hoards


def body(fake_chat: FakeChatServer, rollout_id: str, key: str, then: str, **extra) -> dict:
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": f"hoard, then {then}"}],
        "chat_completions_url": fake_chat.base_url,
        "llm_api_key": key,
        "grade": False,
        **extra,
    }


async def hoarded(fake_chat: FakeChatServer, rollout_id: str) -> None:
    """Wait until the workflow has written its key and told the policy so."""

    def told() -> bool:
        return any(f"hoarded {rollout_id} " in str(r.body.get("messages")) for r in list(fake_chat.requests))

    async def check() -> bool:
        return told()

    await await_until(check, timeout=180, what=f"{rollout_id} to hoard its key")


@DOCKER_PATH_ONLY
async def test_finished_failed_and_timed_out_trials_keep_no_key(
    tmp_path, bundles_dir, fake_chat, api_key, osmosis_home, sandbox_sdk: SdkPath
):
    """On the Docker path: the custody (the marker, the scrub of the trial's tree, the key kept
    out of the osmosis home) is this host's, run on the files once they are here, whichever SDK
    carried them; the emulator's transfers, which carry them without archives, are the key
    tests' (``test_rollouts.py``, ``assert_harbors_transfer_path``)."""
    sandbox_sdk.require_loopback_endpoint()
    backend = hoarding_backend(tmp_path, bundles_dir, sandbox_sdk, n_concurrent=3)
    async with serve(backend) as url, client_for(url) as client:

        def run(then: str, **kwargs):
            return client.run_rollout(
                initial_messages=[{"role": "user", "content": f"hoard, then {then}"}],
                chat_completions_url=fake_chat.base_url,
                rollout_id=f"end-{then}-{uuid.uuid4().hex[:6]}",
                llm_api_key=api_key,
                grade=False,
                **kwargs,
            )

        finished, failed, timed_out = await asyncio.gather(
            run("finish"), run("fail"), run("block", agent_timeout_sec=8)
        )
    assert finished.status is RolloutStatus.SUCCESS, finished.err_message
    assert failed.err_category is RolloutErrorCategory.AGENT_ERROR, failed.err_message
    assert timed_out.err_category is RolloutErrorCategory.TIMEOUT, timed_out.err_message
    assert len([p for p in (tmp_path / "trials").iterdir()]) == 3
    assert_scrubbed_not_lost(api_key, tmp_path / "trials")
    assert_key_absent(api_key, osmosis_home)
    assert not list((tmp_path / "trials").rglob(MARKER))


@pytest.mark.parametrize("how", ["sigterm", "backend-shutdown"])
async def test_shutdown_leaves_no_key_in_the_trials_it_stopped(tmp_path, bundles_dir, fake_chat, api_key, how):
    """Stopped by the server's drain (SIGTERM's), or by the backend's shutdown; beside the
    latter, a rollout cancelled through the server first (its own trial, on the same backend)."""
    backend = hoarding_backend(tmp_path, bundles_dir, n_concurrent=2 if how == "backend-shutdown" else 1)
    rid = f"shut-me-{uuid.uuid4().hex[:6]}"  # the policy records every run's requests
    if how == "backend-shutdown":
        cancel = f"cancel-me-{uuid.uuid4().hex[:6]}"
        async with serve(backend) as url, http_to(url) as http:
            for rollout_id in (cancel, rid):
                posted = await http.post("/rollout", json=body(fake_chat, rollout_id, api_key, "block"))
                assert posted.status_code == 202
            await hoarded(fake_chat, cancel)
            await hoarded(fake_chat, rid)
            cancelled = await http.post("/rollout/cancel", json={"ids": [cancel]})
            assert cancelled.json()["dispositions"] == {cancel: "cancelled_running"}

            async def ended() -> bool:
                return backend.rollout_status(cancel)["status"] == RolloutStatus.CANCELLED

            await await_until(ended, timeout=120, what="the cancelled rollout to end")
            assert_scrubbed_not_lost(api_key, tmp_path / "trials")  # the cancelled trial's
            await backend.shutdown()
            assert len(list((tmp_path / "trials").iterdir())) == 2
            assert_scrubbed_not_lost(api_key, tmp_path / "trials")
    else:  # the documented server, drained as SIGTERM drains it, with a short grace period
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        app = create_rollout_server(backend=backend, configure_logging=False)
        server = draining_server(app, port=port, shutdown_grace_sec=1.0, delivery_sec=0.5, log_level="warning")
        serving = asyncio.create_task(server.serve())

        async def started() -> bool:
            return server.started

        await await_until(started, timeout=30, what="the server to start")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.post("/rollout", json=body(fake_chat, rid, api_key, "block"))).status_code == 202
            await hoarded(fake_chat, rid)
            server.request_drain()  # what SIGTERM does
        await serving  # the drain cancelled the rollout, then the backend shut down
        assert_scrubbed_not_lost(api_key, tmp_path / "trials")
    assert managed_containers(owner_pid=os.getpid()) == []


CRASHING_HOST = """
import asyncio, os, signal, sys
from pathlib import Path
from harbor.trial.queue import TrialQueue
from osmosis_harbor import key_custody as secrets
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.serving.local import run_one_rollout
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.testing.scripted_policy import FakeChatServer

project, tasks, bundles = map(Path, sys.argv[1:4])
# The injected fault: the host dies after the trial's files landed, before they are scrubbed.
secrets.scrub_tree = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
backend = HarborBackend(orchestrator=TrialQueue(n_concurrent=1), tasks_dir=tasks, agent=sys.argv[4],
                        code_dir=project, bundles_dir=bundles, cleanup_successful_trials=False,
                        environment_config=environment_config("docker"))
print(backend.trials_dir, flush=True)  # the default: a work root in the temporary directory
policy = FakeChatServer()
asyncio.run(run_one_rollout(backend=backend, prompt="hoard, then finish", chat_completions_url=policy.base_url,
                            api_key=os.environ["HOARD_KEY"], label=None, metadata=None, grade=False))
"""


async def test_after_a_host_crash_the_next_start_removes_what_it_cannot_scrub(tmp_path, bundles_dir, api_key):
    crashed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", CRASHING_HOST, str(PROJECT), str(TASKS / "template"), str(bundles_dir), HOARDER],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HOARD_KEY": api_key, "HOME": str(tmp_path / "home")},
    )
    crashed_trials = Path(crashed.stdout.splitlines()[0]) if crashed.stdout else None
    try:
        assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
        assert crashed_trials is not None
        (trial_dir,) = [m.parent for m in crashed_trials.glob(f"*/{MARKER}")]
        # the crash left the key behind, marked
        assert any(spellings(api_key)[0] in p.read_bytes() for p in trial_dir.rglob("*") if p.is_file())
        # a trial a live process holds is not the next start's to remove
        live = tmp_path / "trials" / "live-trial"
        KeyCustody().hold(live, api_key)

        next_start = hoarding_backend(tmp_path, bundles_dir)

        assert not trial_dir.exists()
        assert_key_absent(api_key, crashed_trials, tmp_path / "trials")
        assert (live / MARKER).is_file()
        await next_start.shutdown()
    finally:
        if crashed_trials is not None:
            shutil.rmtree(crashed_trials.parent, ignore_errors=True)
