"""A hostile workflow's files cannot freeze the server, read host files into a result, crash
host code, forge its failure category or keep the key: through the real osmosis server,
Harbor's TrialQueue and Docker sandboxes.

The workflow (``rollout_fixtures.contract_attacks``) plants each attack in ``/logs/agent`` as
root and tells the policy what it planted: that message is each test's positive control (the
attack ran). Whether a FIFO or an absolute link survives the trip to the host depends on the
extraction (``test_contract_files`` plants them on the host directly); what must hold either
way is checked here: ``/health`` answers throughout, every rollout gets a clear result with
the right category, no host canary reaches a result, and no key is left anywhere."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.key_custody import MARKER
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.shim.errors import Redactor
from tests.support.common import FIXTURES, TASKS, managed_containers
from tests.support.lost_sandbox import engine, waiting_at
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
ATTACKER = "rollout_fixtures.contract_attacks:ContractAttackWorkflow"
GATE = "/tmp/contract-gate"


def attack_backend(tmp_path: Path, bundles_dir: Path, n_concurrent: int = 3) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=n_concurrent),
        tasks_dir=TASKS / "template",
        agent=ATTACKER,
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=False,
    )


def planted(fake_chat, rollout_id: str) -> str:
    """What the workflow told the policy it planted (the positive control)."""
    for request in list(fake_chat.requests):
        text = str(request.body.get("messages"))
        if f"planted {rollout_id} " in text:
            return text
    raise AssertionError(f"{rollout_id} never planted its attack")


class HealthWatch:
    """Polls ``/health`` until stopped; every answer is recorded."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[int] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as http:
            while not self._stop.is_set():
                self.answers.append((await http.get("/health")).status_code)
                try:
                    await asyncio.wait_for(self._stop.wait(), 0.2)  # pacing between polls
                except TimeoutError:
                    pass

    def stop(self) -> None:
        self._stop.set()


async def test_planted_samples_neither_freeze_the_server_nor_reach_the_result(tmp_path, bundles_dir, fake_chat):
    canary = tmp_path / "host" / "canary.json"
    canary.parent.mkdir()
    canary.write_text('{"messages": [{"role": "user", "content": "HOST-CANARY-7f3a"}]}')
    canary.chmod(0o600)
    before = canary.stat()
    backend = attack_backend(tmp_path, bundles_dir)
    ids = {k: f"{k}-{uuid.uuid4().hex[:6]}" for k in ("fifo", "link", "bomb")}
    prompts = {"fifo": "attack: fifo-sample", "link": f"attack: link-sample {canary}", "bomb": "attack: bomb-sample"}
    async with serve(backend) as url, client_for(url) as client:
        watch = HealthWatch(url)
        watching = asyncio.create_task(watch.run())
        results = await asyncio.gather(
            *(
                client.run_rollout(
                    initial_messages=[{"role": "user", "content": prompts[k]}],
                    chat_completions_url=fake_chat.base_url,
                    rollout_id=ids[k],
                    grade=False,
                )
                for k in ids
            )
        )
        watch.stop()
        await watching
    fifo, link, bomb = results
    assert "fifo=True" in planted(fake_chat, ids["fifo"])
    assert f"link={canary}" in planted(fake_chat, ids["link"])
    assert "bomb=1000000" in planted(fake_chat, ids["bomb"])
    assert watch.answers and set(watch.answers) == {200}  # the server answered throughout

    for result in (fifo, link):  # refused wherever it stops (extraction or reader): a clear failure
        assert result.status is RolloutStatus.FAILURE
        assert result.err_category in {RolloutErrorCategory.VALIDATION_ERROR, RolloutErrorCategory.AGENT_ERROR}, (
            result.err_message
        )
        assert "sample.json" in result.err_message
    assert "HOST-CANARY-7f3a" not in link.model_dump_json()
    assert str(canary) not in (link.err_message or "")
    after = canary.stat()
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)

    assert bomb.status is RolloutStatus.FAILURE
    assert bomb.err_category is RolloutErrorCategory.VALIDATION_ERROR, bomb.err_message
    assert bomb.err_message.startswith("agent/sample.json: JSON nested deeper than"), bomb.err_message
    assert managed_containers(owner_pid=os.getpid()) == []


async def test_a_forged_category_is_the_workflows_and_a_loss_the_host_saw_is_internal(tmp_path, bundles_dir, fake_chat):
    backend = attack_backend(tmp_path, bundles_dir)
    ids = {k: f"{k}-{uuid.uuid4().hex[:6]}" for k in ("internal", "timeout", "lost")}
    async with serve(backend) as url, client_for(url) as client:

        async def start(key: str, attack: str, **kwargs):
            return await client.run_rollout_async(
                initial_messages=[{"role": "user", "content": f"attack: {attack}"}],
                chat_completions_url=fake_chat.base_url,
                rollout_id=ids[key],
                grade=False,
                **kwargs,
            )

        handles = {
            "internal": await start("internal", "forged-internal"),
            "timeout": await start("timeout", "forged-timeout", agent_timeout_sec=300),
            "lost": await start("lost", "forged-then-wait"),
        }
        victim = await waiting_at(backend, ids["lost"], GATE)
        engine().kill(victim["Id"])  # the infrastructure, as the host will see it
        results = {k: await h.wait_for_completion() for k, h in handles.items()}

    assert "forged=internal_error" in planted(fake_chat, ids["internal"])
    assert "forged=timeout" in planted(fake_chat, ids["timeout"])
    forged = results["internal"]
    assert forged.status is RolloutStatus.FAILURE
    assert forged.err_category is RolloutErrorCategory.AGENT_ERROR, forged.err_message
    assert "sandbox was lost to the infrastructure" in forged.err_message  # its words, not its category
    early = results["timeout"]  # claims its deadline fired long before the host's 270 s
    assert early.err_category is RolloutErrorCategory.AGENT_ERROR, early.err_message
    # positive control: the same forged file, and a loss the host saw itself
    lost = results["lost"]
    assert lost.err_category is RolloutErrorCategory.INTERNAL_ERROR, lost.err_message
    assert "was lost" in lost.err_message and lost.err_message.endswith("during the agent phase")
    assert managed_containers(owner_pid=os.getpid()) == []


async def test_the_key_in_link_targets_and_colliding_names_is_scrubbed_and_never_logged(
    tmp_path, bundles_dir, fake_chat, caplog, capfd
):
    key = f'sk-links/{uuid.uuid4().hex}+"q"\\ é&x=1'
    backend = attack_backend(tmp_path, bundles_dir, n_concurrent=1)
    rollout_id = f"links-{uuid.uuid4().hex[:6]}"
    with caplog.at_level(logging.DEBUG):
        async with serve(backend) as url, client_for(url) as client:
            result = await client.run_rollout(
                initial_messages=[{"role": "user", "content": "attack: key-in-links"}],
                chat_completions_url=fake_chat.base_url,
                rollout_id=rollout_id,
                llm_api_key=key,
                grade=False,
            )
    assert "links=planted" in planted(fake_chat, rollout_id)
    assert result.status is RolloutStatus.FAILURE  # no sample: the workflow exited before writing one
    trials = tmp_path / "trials"
    agent = next(trials.glob("*/agent"))
    assert (agent / "***" / "occupant.txt").read_text() == "not empty"  # the collision was really there
    retained = {p.name for p in agent.iterdir()}
    assert "***~1" in retained and quote(key, safe="") not in retained
    assert not (agent / "x-link").is_symlink() and "***" in (agent / "x-link").read_text()
    captured = capfd.readouterr()
    for spelling in Redactor.for_key(key).secrets:
        for path in trials.rglob("*"):
            assert spelling not in path.name, path
            if path.is_symlink():
                assert spelling not in os.readlink(path), path
            elif path.is_file():
                assert spelling.encode() not in path.read_bytes(), path
        for text in (caplog.text, captured.out, captured.err, result.model_dump_json()):
            assert spelling not in text
    assert not list(trials.rglob(MARKER))
