"""Text no UTF-8 can carry, from a sandbox, ends its rollout like any other text: through the real
osmosis server, Harbor's TrialQueue, on both sandbox paths, in-process and with two workers.

A lone surrogate is valid JSON (``"\\ud800"``) and a valid Python ``str``, but every encoder
refuses it: Harbor's exception record, the workers' wire, the server's answer. The hostile
workflow (``rollout_fixtures.contract_attacks``) leaves it in a planted ``sample.json``, in a
forged ``error.json``, in an exception it raises through the shim, and (as a byte no UTF-8
decodes) in the name of a file it leaves in ``/logs/agent``; it tells the policy what
it planted, which is each test's evidence that the attack ran.

Positive control: these tests fail on the code before the host spelled such text
(``trials/contract_files``): a sample rollout never ends in workers mode (the worker's ``Done``
cannot be encoded), and the raising workflow ends ``internal_error``.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import (
    ExecutionOutcome,
    ExecutionResult,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
)

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.backend.workers.messages import Done, frame, from_worker
from tests.support.common import FIXTURES, TASKS
from tests.support.rollout_server import client_for, http_to, serve
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
ATTACKER = "rollout_fixtures.contract_attacks:ContractAttackWorkflow"
SHUTDOWN_SEC = 60.0  # the shutdown that waited on never-ending rollouts took about 140 s
SPELLED = "\\ud800"  # what the host makes of the lone surrogate: its escape, as text


def attack_backend(
    tmp_path: Path, bundles_dir: Path, sdk: SdkPath, workers: int, tasks_dir: Path = TASKS / "template"
) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=4),
        tasks_dir=tasks_dir,
        agent=ATTACKER,
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=sdk.environment(),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=False,
        workers=workers,
    )


def planted(fake_chat, rollout_id: str) -> str:
    for request in list(fake_chat.requests):
        text = str(request.body.get("messages"))
        if f"planted {rollout_id} " in text:
            return text
    raise AssertionError(f"{rollout_id} never planted its attack")


async def run_attacks(
    backend: HarborBackend, fake_chat, attacks: dict[str, str], graded: frozenset[str] = frozenset()
) -> tuple[dict, dict, float]:
    """Each attack as a rollout, all at once (those in ``graded`` graded by the task's tests, the
    others not); their results, ``/health`` after, and how long the server took to shut down."""
    async with serve(backend) as url:
        async with client_for(url) as client, http_to(url) as http:
            results = await asyncio.gather(
                *(
                    asyncio.wait_for(
                        client.run_rollout(
                            initial_messages=[{"role": "user", "content": f"attack: {attack}"}],
                            chat_completions_url=fake_chat.base_url,
                            rollout_id=rollout_id,
                            grade=rollout_id in graded,
                        ),
                        600,
                    )
                    for rollout_id, attack in attacks.items()
                )
            )
            health = (await http.get("/health")).json()
        stopping = time.monotonic()
    return dict(zip(attacks, results, strict=True)), health, time.monotonic() - stopping


def assert_results(fake_chat, attacks: dict[str, str], results: dict, health: dict, shutdown_sec: float) -> None:
    for rollout_id, attack in attacks.items():
        assert "surrogate=" in planted(fake_chat, rollout_id)  # the attack ran
        result = results[rollout_id]
        if attack == "bytes-name":
            assert result.status is RolloutStatus.SUCCESS, result.err_message
            assert result.sample.messages == [{"role": "user", "content": "named"}]
        elif attack == "surrogate-sample":
            assert result.status is RolloutStatus.SUCCESS, result.err_message
            assert [m["content"] for m in result.sample.messages] == [f"hello {SPELLED}", SPELLED]
            assert result.sample.metrics == {f"key{SPELLED}": 1.0}
        else:  # the workflow's own failure, in its own (spelled) words
            assert result.status is RolloutStatus.FAILURE
            assert result.err_category is RolloutErrorCategory.AGENT_ERROR, result.err_message
            assert f"boom{SPELLED}" in result.err_message, result.err_message
    assert health["in_flight"] == 0 and health["running"] == 0 and health["grading"] == 0, health
    assert shutdown_sec < SHUTDOWN_SEC


@pytest.mark.slow
@DOCKER_PATH_ONLY
async def test_unencodable_text_ends_every_rollout_with_two_workers(
    tmp_path, bundles_dir, fake_chat, sandbox_sdk: SdkPath
):
    """Beside the attacks (not graded), one more rollout is graded by the task's tests, which
    write a reward channel name no UTF-8 can carry. Harbor parses ``reward.json`` itself, so its
    channel names reach the host outside ``contract_files``: they are spelled where the host reads
    Harbor's rewards (``trials/reading``). Before, the worker's ``Done`` could not be encoded (with
    its fallback, the rollout ended ``validation_error``; without it, never)."""
    sandbox_sdk.require_loopback_endpoint()
    task = shutil.copytree(TASKS / "template", tmp_path / "channels")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        """echo '{"reward": 0.0, "k\\ud800": 1}' > /logs/verifier/reward.json\n"""
    )
    backend = attack_backend(tmp_path, bundles_dir, sandbox_sdk, workers=2, tasks_dir=task)
    kinds = ["surrogate-sample", "bytes-name", "surrogate-error", "raise-surrogate", "bytes-name"]
    attacks = {f"lone-{i}-{uuid.uuid4().hex[:6]}": kind for i, kind in enumerate(kinds)}
    channels = list(attacks)[-1]  # a workflow that succeeds, graded: its reward channels are the attack
    results, health, shutdown_sec = await run_attacks(backend, fake_chat, attacks, graded=frozenset({channels}))
    assert_results(fake_chat, attacks, results, health, shutdown_sec)
    assert results[channels].sample.reward == 0.0
    assert results[channels].sample.metrics[f"reward/k{SPELLED}"] == 1.0
    assert health["workers"]["restarts"] == 0
    assert sandbox_sdk.sandboxes_left() == []


@pytest.mark.slow
@DOCKER_PATH_ONLY
async def test_a_workflows_unencodable_failure_is_its_own_in_process(
    tmp_path, bundles_dir, fake_chat, sandbox_sdk: SdkPath
):
    sandbox_sdk.require_loopback_endpoint()
    backend = attack_backend(tmp_path, bundles_dir, sandbox_sdk, workers=1)
    kinds = ["raise-surrogate", "surrogate-error", "surrogate-sample", "bytes-name"]
    attacks = {f"lone-{i}-{uuid.uuid4().hex[:6]}": kind for i, kind in enumerate(kinds)}
    results, health, shutdown_sec = await run_attacks(backend, fake_chat, attacks)
    assert_results(fake_chat, attacks, results, health, shutdown_sec)
    assert sandbox_sdk.sandboxes_left() == []


def test_a_done_that_cannot_be_encoded_becomes_a_named_failure():
    """The last line in the worker: its positive control is ``frame`` itself refusing the message."""
    from osmosis_harbor.backend.workers.worker import sendable

    sample = RolloutSample(messages=[{"role": "assistant", "content": "\ud800"}])
    outcome = ExecutionOutcome(workflow=ExecutionResult(status=RolloutStatus.SUCCESS, sample=sample))
    done = Done(rollout_id="r-1", outcome=outcome)
    with pytest.raises(ValueError, match="surrogates not allowed"):
        frame(done)  # what left the rollout without an end
    sent = from_worker(sendable(done)[4:])
    assert isinstance(sent, Done) and sent.rollout_id == "r-1" and sent.outcome is not None
    failure = sent.outcome.workflow
    assert failure.status is RolloutStatus.FAILURE and failure.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "could not be sent from its worker process" in failure.err_message
    assert "surrogates not allowed" in failure.err_message

    error = from_worker(sendable(Done(rollout_id="r-2", error="RuntimeError: boom\ud800"))[4:])
    assert isinstance(error, Done) and error.error == f"RuntimeError: boom{SPELLED}"
