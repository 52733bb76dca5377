"""A rollout's failure category comes from what the host saw, never from what a sandbox
claimed (``osmosis_harbor.backend.categories``), read through ``build_outcome`` with Harbor's
own ``TrialResult`` model and a trial directory as the sandbox left it.

A forged ``error.json`` saying ``internal_error`` (which a trainer masks out of the reward)
becomes ``agent_error``; the positive control is the same file beside a failure the host
observed itself (a lost sandbox, an engine error while grading), which is ``internal_error``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from harbor.models.trial.config import TaskConfig, TrialConfig
from harbor.models.trial.result import AgentInfo, ExceptionInfo, LocalTaskId, TimingInfo, TrialResult
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.backend.categories import Claim, claimed_category
from osmosis_harbor.backend.outcome import build_outcome
from osmosis_harbor.backend.plan import RewardSource
from osmosis_harbor.trials.contract_files import ContractBounds

T0 = datetime(2026, 12, 1, tzinfo=UTC)
FORGED = {
    "phase": "agent",
    "type": "SandboxLostError",
    "message": "sandbox was lost to the infrastructure",
    "category": "internal_error",
    "traceback": "",
}


def trial_result(
    trial_dir: Path, exception_type: str | None, *, agent_sec: float = 5.0, verifier_started: bool = False
) -> TrialResult:
    timing = TimingInfo(started_at=T0, finished_at=T0 + timedelta(seconds=agent_sec))
    verifier = TimingInfo(
        started_at=T0 + timedelta(seconds=agent_sec), finished_at=T0 + timedelta(seconds=agent_sec + 1)
    )
    return TrialResult(
        task_name="t",
        trial_name=trial_dir.name,
        trial_uri=f"file://{trial_dir}",
        task_id=LocalTaskId(path=trial_dir),
        task_checksum="0",
        config=TrialConfig(task=TaskConfig(path=trial_dir / "no-task")),
        agent_info=AgentInfo(name="workflow", version="0"),
        agent_execution=timing,
        verifier=verifier if verifier_started else None,
        exception_info=None
        if exception_type is None
        else ExceptionInfo(
            exception_type=exception_type, exception_message="it failed", exception_traceback="", occurred_at=T0
        ),
    )


def outcome(trial_dir: Path, result: TrialResult, *, deadline: float | None = None, source=RewardSource.GRADER):
    return build_outcome(
        result,
        trial_dir,
        ContractBounds.of(settings.current()),
        reward_source=source,
        label=None,
        base_extra={},
        agent_deadline_sec=deadline,
    ).result


@pytest.fixture
def trial(tmp_path: Path) -> Path:
    for sub in ("agent", "verifier"):
        (tmp_path / "trial" / sub).mkdir(parents=True)
    return tmp_path / "trial"


def write(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document))


def test_a_workflows_claim_of_internal_error_is_its_own_failure(trial: Path) -> None:
    write(trial / "agent" / "error.json", FORGED)
    forged = outcome(trial, trial_result(trial, "WorkflowFailedError"))
    assert forged.status is RolloutStatus.FAILURE
    assert forged.err_category is RolloutErrorCategory.AGENT_ERROR, forged.err_message
    assert "sandbox was lost to the infrastructure" in forged.err_message  # its own words are kept

    # positive control: the same file, and the host itself saw the sandbox go
    lost = outcome(trial, trial_result(trial, "SandboxLostError"))
    assert lost.err_category is RolloutErrorCategory.INTERNAL_ERROR, lost.err_message


@pytest.mark.parametrize(
    ("claimed", "expected"),
    [
        ("validation_error", RolloutErrorCategory.VALIDATION_ERROR),
        ("agent_error", RolloutErrorCategory.AGENT_ERROR),
        ("no-such-category", RolloutErrorCategory.AGENT_ERROR),
        (None, RolloutErrorCategory.AGENT_ERROR),
    ],
)
def test_a_workflow_may_claim_its_own_categories(trial: Path, claimed, expected) -> None:
    write(trial / "agent" / "error.json", {**FORGED, "category": claimed})
    assert outcome(trial, trial_result(trial, "WorkflowFailedError")).err_category is expected


def test_a_claimed_timeout_needs_the_hosts_deadline_to_have_passed(trial: Path) -> None:
    write(trial / "agent" / "error.json", {**FORGED, "category": "timeout", "message": "workflow exceeded"})
    early = outcome(trial, trial_result(trial, "WorkflowFailedError", agent_sec=2.0), deadline=9.0)
    assert early.err_category is RolloutErrorCategory.AGENT_ERROR, early.err_message
    unset = outcome(trial, trial_result(trial, "WorkflowFailedError", agent_sec=20.0), deadline=None)
    assert unset.err_category is RolloutErrorCategory.AGENT_ERROR, unset.err_message
    # positive control: the host gave the shim 9 s and saw the phase run 9.5 s
    fired = outcome(trial, trial_result(trial, "WorkflowFailedError", agent_sec=9.5), deadline=9.0)
    assert fired.err_category is RolloutErrorCategory.TIMEOUT, fired.err_message


def test_an_unreadable_error_file_is_the_workflows_failure(trial: Path) -> None:
    import os

    os.mkfifo(trial / "agent" / "error.json")
    result = outcome(trial, trial_result(trial, "WorkflowFailedError"))
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert "agent/error.json: a FIFO" in result.err_message


def test_a_graders_claim_of_internal_error_is_not_believed(trial: Path) -> None:
    write(trial / "agent" / "sample.json", {"messages": []})
    write(trial / "verifier" / "error.json", {**FORGED, "phase": "verifier"})
    graded = build_outcome(
        trial_result(trial, None, verifier_started=True),
        trial,
        ContractBounds.of(settings.current()),
        reward_source=RewardSource.GRADER,
        label=None,
        base_extra={},
    )
    assert graded.workflow.status is RolloutStatus.SUCCESS
    assert graded.grader is not None and graded.grader.err_category is RolloutErrorCategory.AGENT_ERROR


@pytest.mark.parametrize(
    "exception_type",
    ["DockerEngineUnavailable", "APIError", "ConnectionError", "DownloadVerifierDirError", "AddTestsDirError"],
)
def test_the_engine_failing_during_grading_is_an_internal_error(trial: Path, exception_type: str) -> None:
    """What the host met while verifying is the infrastructure's, whatever the grader wrote."""
    write(trial / "agent" / "sample.json", {"messages": []})
    write(trial / "verifier" / "error.json", {**FORGED, "phase": "verifier", "category": "agent_error"})
    result = outcome(trial, trial_result(trial, exception_type, verifier_started=True))
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR, result.err_message
    assert exception_type in result.err_message


@pytest.mark.parametrize("exception_type", ["RewardFileNotFoundError", "RewardFileEmptyError"])
def test_a_verifier_that_left_no_reward_is_not_the_infrastructures(trial: Path, exception_type: str) -> None:
    """Control for the test above: Harbor's verdicts on the tests' own output stay agent_error."""
    write(trial / "agent" / "sample.json", {"messages": []})
    result = outcome(trial, trial_result(trial, exception_type, verifier_started=True))
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR, result.err_message


def test_a_grader_timeout_is_the_hosts_timeout(trial: Path) -> None:
    write(trial / "agent" / "sample.json", {"messages": []})
    result = outcome(trial, trial_result(trial, "VerifierTimeoutError", verifier_started=True))
    assert result.err_category is RolloutErrorCategory.TIMEOUT


def test_a_nesting_bomb_sample_is_a_validation_error_naming_the_file(trial: Path) -> None:
    (trial / "agent" / "sample.json").write_text("[" * 100_000)
    result = outcome(trial, trial_result(trial, None))
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert result.err_message.startswith("agent/sample.json: JSON nested deeper than")


def test_a_linked_sample_never_reaches_the_result(trial: Path, tmp_path: Path) -> None:
    canary = tmp_path / "canary.json"
    write(canary, {"messages": [{"role": "user", "content": "HOST-CANARY"}]})
    (trial / "agent" / "sample.json").symlink_to(canary)
    result = outcome(trial, trial_result(trial, None))
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "symbolic link" in result.err_message
    assert "HOST-CANARY" not in result.model_dump_json()


def test_a_wrong_bundle_line_is_at_most_a_validation_error(trial: Path) -> None:
    """The baked-bundle check prints its line in the workflow's own exec, where a workflow can
    print the same line and exit 93: that word of the sandbox cannot make an internal_error."""
    claimed = outcome(trial, trial_result(trial, "WrongBundleError"))
    assert claimed.err_category is RolloutErrorCategory.VALIDATION_ERROR, claimed.err_message
    # control: an install the host ran and saw fail stays the infrastructure's
    installed = outcome(trial, trial_result(trial, "BundleInstallError"))
    assert installed.err_category is RolloutErrorCategory.INTERNAL_ERROR, installed.err_message


@pytest.mark.parametrize("recorded", ["AddTestsDirError", "DownloadVerifierDirError", "RewardFileNotFoundError", None])
def test_a_loss_the_host_saw_is_lost_whatever_harbor_recorded(trial: Path, recorded: str | None) -> None:
    """Harbor wraps a failed transfer, or swallows a failed agent-log download (so the grader then
    finds no sample): the loss the environment recorded still makes the trial a lost one
    (``backend.losses``), so ``infra_retries`` retries it and the category is ours. Here the
    agent's sandbox went while the agent ran (its attribution by role and moment:
    ``tests/unit/backend/test_lost_sandbox_attribution.py``)."""
    from osmosis_harbor.backend.losses import recognise_loss
    from osmosis_harbor.backend.outcome import lost_sandbox_message
    from osmosis_harbor.errors import AgentSandboxLostError

    write(trial / "verifier" / "error.json", {**FORGED, "type": "AgentSampleError", "category": "validation_error"})
    harbors = trial_result(trial, recorded, verifier_started=True)
    assert lost_sandbox_message(harbors) is None  # positive control: as Harbor recorded it, not a loss
    reason = "container gone: killed or removed by the infrastructure"
    loss = AgentSandboxLostError("hb-x-env", reason, observed_at=T0 + timedelta(seconds=2))

    lost = recognise_loss(harbors, [loss])

    assert lost_sandbox_message(lost) == str(loss)
    result = outcome(trial, lost)
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR, result.err_message
    assert result.err_message.endswith("during the agent phase"), result.err_message
    assert recognise_loss(harbors, []) is harbors  # nothing lost: Harbor's word stands
    # Harbor recorded a later raise (a call failing fast after the loss): the host's first one stands
    later = trial_result(trial, "AgentSandboxLostError", verifier_started=True)
    assert recognise_loss(later, [loss]).exception_info.occurred_at == loss.observed_at


@pytest.mark.parametrize(
    ("document", "claimed"),
    [
        (
            {"type": "Boom", "message": "it broke", "category": "validation_error"},
            ("Boom", "it broke", "validation_error"),
        ),
        ({"type": 5, "message": None, "category": {"x": 1}, "unknown": 1}, ("5", "", None)),
        ({"type": "", "category": 7}, ("Error", "", None)),
        (["not", "an", "object"], ("Error", "['not', 'an', 'object']", None)),
    ],
)
def test_an_error_file_is_read_through_its_lenient_model(document, claimed) -> None:
    """Whatever shape a sandbox gave its ``error.json``, the host reads a bounded claim from it:
    unknown fields ignored, odd values as their text, a non-string category no claim at all."""
    claim = Claim.of(document)
    assert (claim.type, claim.message, claim.category) == claimed
    if claim.category is None:
        assert claimed_category(claim.category, deadline_sec=None, ran_sec=None) is RolloutErrorCategory.AGENT_ERROR
