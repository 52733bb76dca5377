"""The agent's sandbox lost after the workflow ran, before its outputs reached the host, through
the real server (docs/operations.md, "Lost sandboxes").

Harbor's agent timing has ended when it downloads ``/logs/agent`` (best-effort: it swallows the
failure) and collects the artifacts, and its verifier runs next. Read by "the last phase that
started", such a loss was "during the verifier phase" with the workflow a success, and no sample
(the sample never left the lost sandbox). The test plays the infrastructure at the very step: when
Harbor asks the agent's environment for ``/logs/agent``, the agent's container is removed
(``docker rm -f``), then the download runs. A spy on ``build_outcome`` shows the workflow's own
half, which the server's single result hides behind the grader's.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harbor.models.trial.result import TrialResult
from osmosis_ai.rollout.types import ExecutionOutcome, RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import attempts
from osmosis_harbor.sandbox import SandboxEnvironment
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.owner.head_start import VERIFIER_SESSION_MARK
from tests.support.common import managed_containers
from tests.support.lost_sandbox import diagnostics, engine, make_backend, start
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

AGENT_LOGS = "/logs/agent"


def remove_agent_sandbox_at_log_download(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``docker rm -f`` the agent's container as Harbor starts downloading ``/logs/agent`` from it;
    returns the removed sandbox's name once it happened."""
    removed: list[str] = []

    def wrap(method: str) -> None:
        real: Callable[..., Any] = getattr(SandboxEnvironment, method)

        async def losing(self: SandboxEnvironment, *args: Any, **kwargs: Any) -> Any:
            source = kwargs.get("source_dir", args[0] if args else None)
            agents = VERIFIER_SESSION_MARK not in self.session_id
            if agents and not removed and str(source).rstrip("/") == AGENT_LOGS:
                (box,) = [
                    c
                    for c in managed_containers(owner_pid=os.getpid())
                    if c["Labels"].get(L.SANDBOX) == self.sandbox_name
                ]
                await asyncio.to_thread(engine().remove_container, box["Id"], force=True)
                removed.append(self.sandbox_name)
            return await real(self, *args, **kwargs)

        monkeypatch.setattr(SandboxEnvironment, method, losing)

    wrap("download_dir")
    wrap("download_dir_filtered")
    return removed


def spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str | None], list[ExecutionOutcome]]:
    """What Harbor recorded on each trial (before the host's reading), and each outcome built."""
    recorded: list[str | None] = []
    outcomes: list[ExecutionOutcome] = []
    real_recognise, real_build = attempts.recognise_loss, attempts.build_outcome

    def recognise(result: TrialResult, losses: Any) -> TrialResult:
        recorded.append(result.exception_info.exception_type if result.exception_info else None)
        return real_recognise(result, losses)

    def build(*args: Any, **kwargs: Any) -> ExecutionOutcome:
        outcomes.append(real_build(*args, **kwargs))
        return outcomes[-1]

    monkeypatch.setattr(attempts, "recognise_loss", recognise)
    monkeypatch.setattr(attempts, "build_outcome", build)
    return recorded, outcomes


async def test_the_agents_sandbox_lost_before_its_outputs_reached_the_host_is_the_workflows_internal_error(
    tmp_path: Path,
    tasks: Path,  # noqa: F811 (the fixture imported above)
    fake_chat,
    osmosis_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Harbor's own transfer path, on which /logs/agent is fetched by calls of their own after the
    # workflow's exec; on the default route a small /logs rides back in that exec's own output.
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    removed = remove_agent_sandbox_at_log_download(monkeypatch)
    recorded, outcomes = spy(monkeypatch)
    backend = make_backend(tmp_path, tasks)
    rollout_id = f"lost-outputs-{uuid.uuid4().hex[:6]}"
    async with serve(backend) as url, client_for(url) as client:
        handle = await start(client, fake_chat, rollout_id, "reply: echo 42 > answer.txt")
        result = await handle.wait_for_completion()

    assert removed, "the rollout never downloaded the agent's logs"
    # positive control: Harbor itself did not record the loss (it swallowed the download's failure)
    assert recorded and not str(recorded[0]).endswith("SandboxLostError"), recorded
    (outcome,) = outcomes
    assert outcome.workflow.status is RolloutStatus.FAILURE, outcome  # never a success without its sample
    assert outcome.workflow.err_category is RolloutErrorCategory.INTERNAL_ERROR, outcome.workflow.err_message
    assert outcome.grader is None
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR, result.err_message
    assert result.err_message.startswith(f"sandbox {removed[0]} was lost"), result.err_message
    assert "verifier" not in result.err_message, result.err_message
    assert diagnostics(osmosis_home, rollout_id)["failed_phase"] == "agent"
    assert managed_containers(owner_pid=os.getpid()) == []
