"""Warm interpreters (``osmosis_harbor/shim/warm.py``, ``handoff.py``): a baked image's ENTRYPOINT
starts a Python that imported ``osmosis_ai``; the agent's and the grader's console scripts hand
their run to it, or run cold.

Real osmosis server and client, real Harbor TrialQueue, real sandboxes on both SDK paths. That a
run was served warm is shown by the run itself: its summary line says ``served=warm`` (the warm
child sets it) and the probe workflow reports the warm child's facts, not by a timing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend

from .backends import make_backend
from .rollout_server import client_for, serve
from .sdk_paths import SdkPath
from .support import graded_template

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

ANSWER = "Write 42 to answer.txt\nreply: echo 42 > answer.txt"
KEY = f"sk-warm-{uuid.uuid4().hex}"


@pytest.fixture
def warm_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_WARM_INTERPRETERS", "1")


async def rollout(target: HarborBackend, fake_chat, text: str = ANSWER, *, grade: bool = True, **kwargs):
    async with serve(target) as url, client_for(url) as client:
        return await client.run_rollout(
            initial_messages=[{"role": "user", "content": text}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=f"warm-{uuid.uuid4().hex[:8]}",
            llm_api_key=KEY,
            label="42",
            grade=grade,
            **kwargs,
        )


def served(trials: Path, log: str) -> list[str]:
    """The ``served=`` token of each shim summary line in the trials' ``log`` (a path in a trial
    directory: ``agent/workflow.log``, ``verifier/test-stdout.txt``)."""
    tokens = []
    for log in sorted(trials.glob(f"*/{log}")):
        for line in log.read_text().splitlines():
            if line.startswith("osmosis-harbor-shim[") and " served=" in line:
                tokens.append(line.split(" served=", 1)[1].split()[0])
    return tokens


def graded_backend(root: Path, bundles_dir: Path, sdk: SdkPath) -> HarborBackend:
    return make_backend(
        root, bundles_dir, agent="OutputWorkflow", grader="AnswerGrader", tasks_dir=graded_template(root), sdk=sdk
    )


async def test_a_graded_rollout_is_served_warm_and_gives_the_cold_result(
    tmp_path: Path, bundles_dir: Path, fake_chat, sandbox_sdk: SdkPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("OSMOSIS_HARBOR_WARM_INTERPRETERS", mode)
        root = tmp_path / f"warm-{mode}"
        result = await rollout(graded_backend(root, bundles_dir, sandbox_sdk), fake_chat)
        assert result.status is RolloutStatus.SUCCESS, result.err_message
        results[mode] = result
        expected = "warm" if mode == "1" else "cold"
        assert served(root / "trials", "agent/workflow.log") == [expected]  # the agent's run
        assert served(root / "trials", "verifier/test-stdout.txt") == [expected]  # the grader's, in its own sandbox
    cold, warm = results["0"].sample, results["1"].sample
    assert warm.reward == cold.reward == 1.0
    assert warm.messages == cold.messages and warm.metrics == cold.metrics


async def test_the_warm_child_takes_the_rollouts_environment_before_the_workflow_is_imported(
    tmp_path: Path, bundles_dir: Path, fake_chat, sandbox_sdk: SdkPath, warm_on: None
) -> None:
    """The probe reads the rollout id at import: imported after the hand-off, it sees it. Its
    key is in no file and in no process's argv in the sandbox."""
    target = make_backend(
        tmp_path,
        bundles_dir,
        agent="WarmProbeWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path),
        sdk=sandbox_sdk,
    )
    result = await rollout(target, fake_chat, "probe")
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    facts = json.loads(result.sample.messages[-1]["content"])
    assert facts["served"] == "served=warm"
    assert facts["imported_with_rollout_id"] == facts["rollout_id"] is not None
    assert facts["key_set"] and facts["key_in_cmdline"] == [] and facts["key_in_files"] == []
