"""What the backend refuses before any sandbox starts, what it accepts however odd, and
admission capacity that duplicates cannot use up: through the real osmosis server."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import ExecutionRequest, RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.backend.admission import MAX_ROLLOUT_ID_BYTES, request_problem
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS, managed_containers, wait_until
from tests.support.rollout_server import client_for, http_to, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
WF = "rollout_fixtures.workflows"
KEY = "sk-admission-test-key"


@pytest.fixture(scope="module")
def fake_chat() -> Iterator[FakeChatServer]:
    server = FakeChatServer(default_reply="echo osmosis > answer.txt")
    yield server
    server.close()


def backend_for(tmp_path: Path, bundles_dir: Path, agent: str = "ListWorkflow", **kwargs) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=kwargs.pop("n_concurrent", 2)),
        tasks_dir=kwargs.pop("tasks_dir", TASKS / "template"),
        task_mode=kwargs.pop("task_mode", "template"),
        agent=f"{WF}:{agent}",
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=False,
        **kwargs,
    )


def body(fake_chat: FakeChatServer, rollout_id: str, **extra) -> dict:
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": "go"}],
        "chat_completions_url": fake_chat.base_url,
        "llm_api_key": KEY,
        **extra,
    }


async def test_requests_that_cannot_succeed_are_refused_before_any_sandbox(tmp_path, bundles_dir, fake_chat):
    backend = backend_for(tmp_path, bundles_dir)
    hopeless = {
        "agent-negative": ({"agent_timeout_sec": -5}, "agent_timeout_sec"),
        "agent-zero": ({"agent_timeout_sec": 0}, "agent_timeout_sec"),
        "grader-zero": ({"grader_timeout_sec": 0}, "grader_timeout_sec"),
        "grader-negative": ({"grader_timeout_sec": -1.5}, "grader_timeout_sec"),
        "é" * (MAX_ROLLOUT_ID_BYTES // 2 + 1): ({}, "rollout_id"),  # one byte over what the sandbox takes
    }
    async with serve(backend) as url, http_to(url) as http:
        for rid, (extra, _) in hopeless.items():  # the server accepts them all...
            assert (await http.post("/rollout", json=body(fake_chat, rid, **extra))).status_code == 202
        await asyncio.to_thread(  # ...and the backend refuses each before anything else
            wait_until,
            lambda: all((backend.rollout_status(rid) or {}).get("status") == RolloutStatus.FAILURE for rid in hopeless),
            timeout=60,
            what="every rollout refused",
        )
    results = [backend.rollout_status(rid) for rid in hopeless]
    for (_, field), result in zip(hopeless.values(), results, strict=True):
        assert result["err_category"] == RolloutErrorCategory.VALIDATION_ERROR, result["error"]
        assert result["error"].startswith(field), result["error"]
    assert "positive number of seconds" in results[0]["error"] and "-5" in results[0]["error"]
    assert str(MAX_ROLLOUT_ID_BYTES) in results[-1]["error"]
    assert managed_containers(owner_pid=os.getpid()) == []  # no sandbox ever started
    assert not (tmp_path / "trials").exists() or not any((tmp_path / "trials").iterdir())
    # Non-finite timeouts never pass the server's request model; a direct caller that
    # bypasses ExecutionRequest's validation is refused by the backend all the same.
    for value in (float("nan"), float("inf")):
        request = ExecutionRequest.model_construct(id="x", prompt=[], agent_timeout_sec=value, grader_timeout_sec=None)
        assert "agent_timeout_sec must be a positive number" in request_problem(request)


async def test_any_id_the_server_accepts_runs(tmp_path, bundles_dir, fake_chat):
    """300 characters (too long for a file name), non-ASCII, dots, quotes, percent signs."""
    odd = ("ünïcødé-" * 20 + ". .. 'quoted' \"double\" %2F $HOME *?")[:300].ljust(300, "x")
    backend = backend_for(tmp_path, bundles_dir)
    async with serve(backend) as url, http_to(url) as http:
        # (osmosis' RolloutClient does not quote the id into its result URL, so POST it here)
        assert (await http.post("/rollout", json=body(fake_chat, odd))).status_code == 202
        await asyncio.to_thread(
            wait_until,
            lambda: (backend.rollout_status(odd) or {}).get("finished_at"),
            timeout=180,
            what="the rollout to end",
        )
    status = backend.rollout_status(odd)
    assert status["status"] == RolloutStatus.SUCCESS and status["reward"] == 1.0, status["error"]
    (trial_dir,) = (tmp_path / "trials").iterdir()
    assert len(trial_dir.name) < 64 and trial_dir.name.startswith("n-c-d-n-c-d-")
    assert status["trial_name"] == trial_dir.name


async def test_duplicate_ids_do_not_use_up_capacity(tmp_path, bundles_dir, fake_chat):
    backend = backend_for(tmp_path, bundles_dir, agent="SleepyWorkflow", n_concurrent=1, max_queue_depth=1)
    async with serve(backend) as url, http_to(url) as http:
        assert (await http.post("/rollout", json=body(fake_chat, "dup", grade=False))).status_code == 202
        await asyncio.to_thread(
            wait_until,
            lambda: (backend.rollout_status("dup") or {}).get("status") == RolloutStatus.RUNNING,
            timeout=120,
            what="the rollout running",
        )
        for _ in range(12):
            assert (await http.post("/rollout", json=body(fake_chat, "dup", grade=False))).status_code == 409
        assert (await http.get("/health")).json()["queued"] == 0
        fresh = await http.post("/rollout", json=body(fake_chat, "fresh", grade=False))
        assert fresh.status_code == 202, fresh.text
        assert (await http.get("/health")).json()["queued"] == 1
        # and the depth still holds
        assert (await http.post("/rollout", json=body(fake_chat, "one-too-many", grade=False))).status_code == 429
        await http.post("/rollout/cancel", json={"all": True})
    assert managed_containers(owner_pid=os.getpid()) == []


async def test_a_symlink_loop_in_a_task_is_a_validation_error(tmp_path, bundles_dir, fake_chat):
    dataset = tmp_path / "ds"
    pair = shutil.copytree(TASKS / "template", dataset / "pair-loop")
    (pair / "tests" / "a").symlink_to("b")
    (pair / "tests" / "b").symlink_to("a")
    single = shutil.copytree(TASKS / "template", dataset / "self-loop")
    (single / "environment" / "me").symlink_to("me")
    backend = backend_for(tmp_path, bundles_dir, tasks_dir=dataset, task_mode="dataset")
    async with serve(backend) as url, client_for(url) as client:
        results = await asyncio.gather(
            *(
                client.run_rollout(
                    initial_messages=[{"role": "user", "content": "go"}],
                    chat_completions_url=fake_chat.base_url,
                    rollout_id=task,
                    llm_api_key=KEY,
                    metadata={"harbor_task_id": task},
                )
                for task in ("pair-loop", "self-loop")
            )
        )
    for result, link in zip(results, ("tests/a", "environment/me"), strict=True):
        assert result.status is RolloutStatus.FAILURE
        assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR, result.err_message
        assert link in result.err_message and "is a loop" in result.err_message, result.err_message
        assert "\n" not in result.err_message
    assert managed_containers(owner_pid=os.getpid()) == []
