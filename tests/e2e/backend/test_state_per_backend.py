"""State belongs to a backend, not to the process: two ``HarborBackend``s in one process, serving
through the real osmosis server on Docker, see the same rollout id and keep their own keys, and
one shutting down while the other runs a rollout leaves the other's sandbox alone."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS, managed_containers, wait_until
from tests.support.rollout_server import serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
WF = "rollout_fixtures.workflows"
KEY_A = "sk-backend-a-key"
KEY_B = "sk-backend-b-key"


@pytest.fixture(scope="module")
def fake_chat() -> Iterator[FakeChatServer]:
    server = FakeChatServer(default_reply="echo osmosis > answer.txt")
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_LEDGER", str(tmp_path / "ledger.sqlite3"))


def _backend(tmp_path: Path, bundles_dir: Path, name: str, agent: str) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=2),
        tasks_dir=TASKS / "template",
        task_mode="template",
        agent=f"{WF}:{agent}",
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker", host_network=True),
        trials_dir=tmp_path / name / "trials",
        cleanup_successful_trials=False,
    )


def _body(fake_chat: FakeChatServer, key: str, **extra: object) -> dict[str, object]:
    return {
        "rollout_id": "same-id",
        "initial_messages": [{"role": "user", "content": "go"}],
        "chat_completions_url": fake_chat.base_url,
        "llm_api_key": key,
        **extra,
    }


def _status(backend: HarborBackend) -> dict[str, object]:
    return backend.rollout_status("same-id") or {}


def _running(name: str) -> bool:
    return any(name in c["Names"][0] and c["State"] == "running" for c in managed_containers(owner_pid=os.getpid()))


async def test_two_backends_keep_their_own_keys_and_sandboxes(
    tmp_path: Path, bundles_dir: Path, fake_chat: FakeChatServer
) -> None:
    a = _backend(tmp_path, bundles_dir, "a", "SleepyWorkflow")
    b = _backend(tmp_path, bundles_dir, "b", "ListWorkflow")
    async with serve(a) as url_a, serve(b) as url_b, httpx.AsyncClient() as http:
        assert (await http.post(f"{url_a}/rollout", json=_body(fake_chat, KEY_A, grade=False))).status_code == 202
        await asyncio.to_thread(
            wait_until,
            lambda: _status(a).get("status") == RolloutStatus.RUNNING and a.owner.sandboxes.names(),
            timeout=180,
            what="backend A's rollout running in its sandbox",
        )
        [a_sandbox] = a.owner.sandboxes.names()
        # The same rollout id on B, with another key: B's workflow gets B's key, and B's end of
        # the rollout drops only B's copy.
        fake_chat.requests.clear()
        assert (await http.post(f"{url_b}/rollout", json=_body(fake_chat, KEY_B))).status_code == 202
        await asyncio.to_thread(wait_until, lambda: _status(b).get("finished_at"), timeout=300, what="B's rollout")
        status = _status(b)
        assert status["status"] == RolloutStatus.SUCCESS and status["reward"] == 1.0, status.get("error")
        keys_seen = {r.authorization for r in fake_chat.requests if r.path.endswith("/chat/completions")}
        assert keys_seen == {f"Bearer {KEY_B}"}
        held = a.owner.credentials.get("same-id")
        assert held is not None and held.api_key == KEY_A and b.owner.credentials.get("same-id") is None
        # B shuts down while A's rollout runs: A's sandbox is not B's to terminate.
        assert _running(a_sandbox)  # positive control: there is something B's sweep could hit
        await b.shutdown()
        assert _running(a_sandbox) and a.owner.sandboxes.registered(a_sandbox)
        assert _status(a).get("status") == RolloutStatus.RUNNING
        await a.shutdown()
    assert not _running(a_sandbox)
    assert managed_containers(owner_pid=os.getpid()) == []
