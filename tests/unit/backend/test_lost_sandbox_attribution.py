"""Whose sandbox was lost, and when, decides whose failure it is (docs/operations.md, "Lost sandboxes"), read
through ``build_outcome`` with Harbor's own ``TrialResult`` and a trial directory as a sandbox left
it. The host records the first loss it saw with its role (the error's class) and its moment
(``backend.losses``); Harbor's phase timings alone cannot tell a loss while its agent ran from one
while it downloaded the agent's outputs. The rule under test: the agent's sandbox lost before its
outputs were on the host is the workflow's ``internal_error``; only a loss while verifying (the
verifier's own sandbox, or the agent's during a verification in it) keeps the workflow judged on its
outputs, and a workflow success always comes with the sample it needs.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from harbor.models.trial.result import TimingInfo, TrialResult
from osmosis_ai.rollout.types import ExecutionOutcome, RolloutErrorCategory, RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.backend.losses import recognise_loss
from osmosis_harbor.backend.outcome import build_outcome
from osmosis_harbor.backend.plan import RewardSource
from osmosis_harbor.errors import AgentSandboxLostError, SandboxLostError, VerifierSandboxLostError
from osmosis_harbor.trials.contract_files import ContractBounds
from tests.unit.backend.test_categories import T0, trial, trial_result, write  # noqa: F401 (fixture)

REASON = "container gone: killed or removed by the infrastructure"
SAMPLE = {"messages": [{"role": "assistant", "content": "42"}]}


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def graded_trial(trial_dir: Path, recorded: str | None) -> TrialResult:
    """The agent ran 0-5 s; Harbor collected its outputs 5-6 s; the verifier ran from 6 s."""
    result = trial_result(trial_dir, recorded, verifier_started=True)
    return result.model_copy(update={"verifier": TimingInfo(started_at=at(6), finished_at=at(7))})


def read(trial_dir: Path, loss: SandboxLostError, recorded: str | None, source=RewardSource.GRADER) -> ExecutionOutcome:
    result = recognise_loss(graded_trial(trial_dir, recorded), [loss])
    return build_outcome(
        result, trial_dir, ContractBounds.of(settings.current()), reward_source=source, label=None, base_extra={}
    )


def test_the_agents_sandbox_lost_while_its_outputs_were_downloaded_is_the_workflows_internal_error(
    trial: Path,  # noqa: F811
) -> None:
    """Harbor swallows the failed log download; its grader then finds no sample (recorded:
    ``RewardFileNotFoundError``, while the verifier ran). With the last phase that started, this
    read "during the verifier phase", the workflow a success with no sample."""
    for sample in (None, SAMPLE):  # none downloaded, or the sample came but the artifacts did not
        if sample is not None:
            write(trial / "agent" / "sample.json", sample)
        loss = AgentSandboxLostError("hb-x-env", REASON, observed_at=at(5.5))
        outcome = read(trial, loss, "RewardFileNotFoundError")
        assert outcome.grader is None
        assert outcome.workflow.status is RolloutStatus.FAILURE
        assert outcome.workflow.err_category is RolloutErrorCategory.INTERNAL_ERROR
        assert outcome.workflow.err_message == (
            f"{loss} after the agent phase, before the agent's outputs reached the host"
        ), outcome.workflow.err_message
        assert outcome.workflow.extra_fields["failed_phase"] == "agent"


def test_the_verifiers_own_sandbox_lost_fails_the_grading_and_keeps_the_workflows_success(
    trial: Path,  # noqa: F811
) -> None:
    write(trial / "agent" / "sample.json", SAMPLE)
    loss = VerifierSandboxLostError("hb-x-verifier-trial", REASON, observed_at=at(6.5))
    outcome = read(trial, loss, "DownloadVerifierDirError")
    assert outcome.workflow.status is RolloutStatus.SUCCESS and outcome.workflow.sample is not None
    assert outcome.grader is not None and outcome.grader.status is RolloutStatus.FAILURE
    assert outcome.grader.err_category is RolloutErrorCategory.INTERNAL_ERROR
    assert outcome.grader.err_message == f"{loss} during the verifier phase"
    # control: the same moment, the agent's sandbox: also a verification's loss only by its moment
    agents = read(trial, AgentSandboxLostError("hb-x-env", REASON, observed_at=at(4)), "DownloadVerifierDirError")
    assert agents.workflow.status is RolloutStatus.FAILURE and agents.grader is None


def test_a_workflow_success_never_comes_without_its_sample(trial: Path) -> None:  # noqa: F811
    """The verifier's sandbox lost, and the host has no sample from the agent's (whose sandbox was
    not lost): the workflow left none, which is its own failure, not a success."""
    loss = VerifierSandboxLostError("hb-x-verifier-trial", REASON, observed_at=at(6.5))
    outcome = read(trial, loss, "RewardFileNotFoundError")
    assert outcome.workflow.status is RolloutStatus.FAILURE
    assert outcome.workflow.err_category is RolloutErrorCategory.AGENT_ERROR, outcome.workflow.err_message
    assert outcome.grader is None


def test_the_agents_sandbox_lost_while_its_own_tests_ran_in_it_fails_the_grading(trial: Path) -> None:  # noqa: F811
    """Harbor's ``shared`` mode (a task's own tests, no grader): the agent's outputs were on the
    host before its verifier started, so a loss seen after that is the grading's."""
    loss = AgentSandboxLostError("hb-x-env", REASON, observed_at=at(6.5))
    outcome = read(trial, loss, "AgentSandboxLostError", source=RewardSource.TASK_TESTS)
    assert outcome.workflow.status is RolloutStatus.SUCCESS
    assert outcome.grader is not None and outcome.grader.err_category is RolloutErrorCategory.INTERNAL_ERROR
    assert outcome.grader.err_message == f"{loss} during the verifier phase"
