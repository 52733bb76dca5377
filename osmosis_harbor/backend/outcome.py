"""Turning a finished Harbor trial of a rollout into an ``osmosis_ai`` ``ExecutionOutcome``.

The in-container shim leaves its products in the trial directory (Harbor downloads
``/logs/agent`` and ``/logs/verifier``): ``agent/sample.json`` or ``agent/error.json``,
then ``verifier/reward.json`` plus ``verifier/sample.json`` (an Osmosis grader) or just a
reward file (a task's own tests), or ``verifier/error.json``. Harbor's own exceptions say
which phase stopped the trial. This module reads both and answers with the rollout
vocabulary: the graded sample, the verifier's reward, and an error category a
controller can act on, with the failing phase and the phase timings in ``extra_fields``.
Every file the sandbox wrote is read through ``sandbox.contract_files`` (no links, no FIFOs,
bounded, depth-bounded JSON), and a category comes from what the host saw
(``backend.categories``): a sandbox's own ``error.json`` never makes an ``internal_error``, and
the policy relay's record of the rollout's calls (``sandbox.relay_record``) makes one when the
relay failed them through no fault of the rollout, whatever its workflow then did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.models.trial.result import TrialResult
from osmosis_ai.rollout.types import (
    ExecutionOutcome,
    ExecutionResult,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
)

from osmosis_harbor.agents.limits import LIMITS_MARK
from osmosis_harbor.backend.categories import Claim, claimed_category, verifier_failure
from osmosis_harbor.backend.plan import RewardSource
from osmosis_harbor.errors import (
    ContractFileError,
    SandboxLostError,
    TrialPhaseError,
    WorkflowFailedError,
    recorded_error,
)
from osmosis_harbor.sandbox.guard import GuardSession
from osmosis_harbor.sandbox.relay.refusals import RelayReport
from osmosis_harbor.shim import contract
from osmosis_harbor.tasks.dockerfile import INCOMPATIBLE_IMAGE_MARKER
from osmosis_harbor.trials.contract_files import ContractBounds, FileKind, read_json
from osmosis_harbor.trials.reading import (
    TIMEOUT_EXCEPTIONS,
    TrialPhase,
    TrialReading,
    agent_had_ended,
    read_trial,
)

__all__ = ["build_outcome", "cancelled", "load_sample", "lost_sandbox_message", "refused"]


def refused(
    message: str, extra: dict[str, Any], category: RolloutErrorCategory = RolloutErrorCategory.VALIDATION_ERROR
) -> ExecutionOutcome:
    """A rollout that ends before (or instead of) its trial."""
    return ExecutionOutcome(
        workflow=ExecutionResult(
            status=RolloutStatus.FAILURE, err_message=message, err_category=category, extra_fields=extra
        )
    )


def cancelled(extra: dict[str, Any]) -> ExecutionOutcome:
    return ExecutionOutcome(
        workflow=ExecutionResult(status=RolloutStatus.CANCELLED, err_message="cancelled", extra_fields=extra)
    )


def load_sample(trial_dir: Path, relative: PurePosixPath, bounds: ContractBounds) -> RolloutSample | None:
    """The sample a sandbox left at ``trial_dir/relative`` (None when there is none); raises
    `ContractFileError` naming the file when it is there but unusable."""
    data = read_json(trial_dir, relative, FileKind.SAMPLE, bounds)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ContractFileError(str(relative), "not a JSON object")
    try:
        return RolloutSample.model_validate(data)
    except ValueError as exc:
        raise ContractFileError(str(relative), f"not a valid sample ({_first_error(exc)})") from None


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors) and (found := errors()):
        where = ".".join(str(p) for p in found[0].get("loc", ()))
        return f"{where}: {found[0].get('msg', '')}"
    return type(exc).__name__


def _read_claim(trial_dir: Path, relative: PurePosixPath, bounds: ContractBounds) -> Claim | None:
    """A sandbox's ``error.json``, as a claim; an unusable one is a claim of its own."""
    try:
        document = read_json(trial_dir, relative, FileKind.ERROR, bounds)
    except ContractFileError as exc:
        return Claim("UnreadableErrorFile", str(exc), None)
    return None if document is None else Claim.of(document)


def _failure(
    message: str, category: RolloutErrorCategory, sample: RolloutSample | None, extra: dict[str, Any]
) -> ExecutionResult:
    return ExecutionResult(
        status=RolloutStatus.FAILURE,
        sample=sample,
        err_message=message,
        err_category=category,
        extra_fields=extra,
    )


def _is_loss(ours: type[TrialPhaseError] | None) -> bool:
    return ours is not None and issubclass(ours, SandboxLostError)


def lost_sandbox_message(result: TrialResult) -> str | None:
    """The one-line reason when a sandbox of the trial was lost to the infrastructure, else None."""
    info = result.exception_info
    if info is None or not _is_loss(recorded_error(info.exception_type)):
        return None
    return (info.exception_message or SandboxLostError.__name__).strip().splitlines()[0]


def _lost_message(result: TrialResult, phase: str | None) -> str:
    """Which sandbox was lost, and when: the agent's may go after its run ended, while Harbor
    downloads its outputs (its timing has ended, the verifier's has not begun)."""
    info = result.exception_info
    if phase == TrialPhase.AGENT.value and info is not None and agent_had_ended(result, info.occurred_at):
        return f"{lost_sandbox_message(result)} after the agent phase, before the agent's outputs reached the host"
    return f"{lost_sandbox_message(result)} during the {phase} phase"


def _lost_sandbox(
    result: TrialResult, phase: str | None, agent_sample: RolloutSample | None, extra: dict[str, Any]
) -> ExecutionOutcome:
    """A sandbox lost before the workflow's outputs were on the host (the agent's, in any phase
    but a verification run in it): not the workflow's failure, and not its success either; an
    ``internal_error`` naming the sandbox and when, which ``infra_retries`` may retry."""
    extra["failed_phase"] = phase
    return ExecutionOutcome(
        workflow=_failure(_lost_message(result, phase), RolloutErrorCategory.INTERNAL_ERROR, agent_sample, extra)
    )


def _setup_or_agent_failure(
    ours: type[TrialPhaseError] | None,
    exc_type: str,
    phase: str | None,
    reading: TrialReading,
    focus: _Focus,
    exception_message: str,
) -> tuple[RolloutErrorCategory, str]:
    """Category and message of a trial stopped before verification (environment, setup, agent)."""
    if ours is WorkflowFailedError:
        said = _read_claim(focus.trial_dir, focus.agent / contract.ERROR_FILENAME, focus.bounds)
        note = _limits(reading) if said is not None else ""  # without its own words, reading.error has it
        claim = said or Claim("Error", reading.error or "", None)
        category = claimed_category(claim.category, deadline_sec=focus.agent_deadline_sec, ran_sec=focus.agent_sec)
        where = f"step {focus.step}: " if focus.step is not None else ""
        if category is RolloutErrorCategory.TIMEOUT:  # the shim's own deadline (a little before Harbor's)
            return category, f"{where}{phase} timed out: {claim.message or reading.error}"
        return category, f"{where}workflow failed: {claim.type}: {claim.message or reading.error}{note}"
    if exc_type in TIMEOUT_EXCEPTIONS:
        return RolloutErrorCategory.TIMEOUT, f"{phase} timed out: {reading.error}"
    if ours is not None and ours.category is RolloutErrorCategory.AGENT_ERROR:  # the host saw the workflow's doing
        return RolloutErrorCategory.AGENT_ERROR, f"{phase} failed: {reading.error}"
    if (
        ours is not None
        and ours.category is RolloutErrorCategory.VALIDATION_ERROR
        or INCOMPATIBLE_IMAGE_MARKER in exception_message
    ):
        return RolloutErrorCategory.VALIDATION_ERROR, f"task image unusable: {reading.error}"
    return RolloutErrorCategory.INTERNAL_ERROR, f"{phase} failed: {reading.error}"


def _limits(reading: TrialReading) -> str:
    """The sandbox limits the failed workflow hit, as the agent noted them first in its error."""
    said = reading.error or ""
    head = f"{WorkflowFailedError.__name__}: {LIMITS_MARK}"
    if not said.startswith(head):
        return ""
    return f" ({LIMITS_MARK}{said[len(head) :].split(' | ', 1)[0]})"


def build_outcome(
    result: TrialResult,
    trial_dir: Path,
    bounds: ContractBounds,
    *,
    reward_source: str,
    label: str | None,
    base_extra: dict[str, Any],
    agent_sample: Any = ...,
    agent_deadline_sec: float | None = None,
    relay: RelayReport | None = None,
    guard: GuardSession | None = None,
) -> ExecutionOutcome:
    """Read ``trial_dir`` and ``result`` into the outcome the osmosis server expects.

    ``agent_sample`` overrides the workflow's ``agent/sample.json`` (native agents' samples
    come from their trajectory). ``agent_deadline_sec``: the deadline the host gave the
    shim (``OSMOSIS_AGENT_TIMEOUT_SEC``), the only one under which a workflow's own
    ``timeout`` is believed. ``relay``: what the policy relay refused of the rollout's calls.
    ``guard``: the trial's verifier guard, whose finding that the verifier's environment was
    tampered with is the host's, whatever Harbor recorded. Reads files a sandbox wrote: call it
    off the event loop."""
    reading = read_trial(result, trial_dir, bounds)
    extra: dict[str, Any] = {**base_extra, "timings_sec": reading.timings_sec, "reward_source": str(reward_source)}
    if relay is not None and (relayed := relay.extra_fields()):
        extra["relay"] = relayed
    focus = _focus(reading, trial_dir, agent_deadline_sec, bounds)
    if focus.step is not None:
        extra["step"] = focus.step
    sample_problem: ContractFileError | None = None
    if agent_sample is ...:
        try:
            agent_sample = load_sample(trial_dir, focus.agent / contract.SAMPLE_FILENAME, bounds)
        except ContractFileError as exc:
            agent_sample, sample_problem = None, exc
            extra["sample_error"] = str(exc)
    if agent_sample is not None and label is not None and agent_sample.label is None:
        agent_sample = agent_sample.model_copy(update={"label": label})
    exc_type = reading.exception_type
    ours = recorded_error(exc_type)
    phase = reading.failed_phase.value if reading.failed_phase else None

    # A lost sandbox's phase is the one the trial was in when the host saw the loss (``reading``):
    # only a loss while verifying (the verifier's own sandbox, or the agent's in Harbor's shared
    # mode, after its outputs were downloaded) leaves the workflow to be judged on its outputs.
    lost_in_grading = _is_loss(ours) and phase == TrialPhase.VERIFIER.value
    if _is_loss(ours) and not lost_in_grading:
        return _lost_sandbox(result, phase, agent_sample, extra)
    relay_failure = relay.failure_message() if relay is not None else None
    if relay_failure is not None and phase != TrialPhase.CANCELLED.value:  # the host's word, not the workflow's
        extra["failed_phase"] = phase or TrialPhase.AGENT.value
        return ExecutionOutcome(
            workflow=_failure(relay_failure, RolloutErrorCategory.INTERNAL_ERROR, agent_sample, extra)
        )
    if exc_type is not None and phase in {
        TrialPhase.ENVIRONMENT.value,
        TrialPhase.AGENT_SETUP.value,
        TrialPhase.AGENT.value,
        TrialPhase.CANCELLED.value,
    }:
        extra["failed_phase"] = phase
        message_of_exception = result.exception_info.exception_message if result.exception_info else ""
        category, message = _setup_or_agent_failure(ours, exc_type, phase, reading, focus, message_of_exception)
        return ExecutionOutcome(workflow=_failure(message, category, agent_sample, extra))

    if sample_problem is not None:  # the workflow ended well but left a sample the host will not use
        extra["failed_phase"] = TrialPhase.AGENT.value
        return ExecutionOutcome(
            workflow=_failure(str(sample_problem), RolloutErrorCategory.VALIDATION_ERROR, None, extra)
        )
    if agent_sample is None and reward_source != RewardSource.TASK_TESTS:
        extra["failed_phase"] = TrialPhase.AGENT.value
        return ExecutionOutcome(
            workflow=_failure(
                "the workflow finished but left no agent/sample.json", RolloutErrorCategory.AGENT_ERROR, None, extra
            )
        )
    workflow = ExecutionResult(status=RolloutStatus.SUCCESS, sample=agent_sample, extra_fields=extra)
    guard_metrics = guard.metrics() if guard is not None else {}
    if guard is not None and guard.tampered is not None:  # reward 0: the workflow's own doing
        forfeited = _with_metrics(agent_sample or RolloutSample(), guard_metrics).model_copy(update={"reward": 0.0})
        extra = {**extra, "failed_phase": TrialPhase.VERIFIER.value}
        return ExecutionOutcome(
            workflow=workflow,
            grader=_failure(str(guard.tampered), RolloutErrorCategory.AGENT_ERROR, forfeited, extra),
        )
    if lost_in_grading:  # the grading failed; the workflow's outputs were judged above, as always
        extra["failed_phase"] = phase
        lost = _failure(_lost_message(result, phase), RolloutErrorCategory.INTERNAL_ERROR, agent_sample, extra)
        return ExecutionOutcome(workflow=workflow, grader=lost)
    if reward_source == RewardSource.NONE:
        return ExecutionOutcome(workflow=workflow)
    graded = _graded(reading, focus, exc_type, reward_source, label, agent_sample, extra)
    if guard_metrics and graded.sample is not None:
        graded = graded.model_copy(update={"sample": _with_metrics(graded.sample, guard_metrics)})
    return ExecutionOutcome(workflow=workflow, grader=graded)


def _with_metrics(sample: RolloutSample, metrics: dict[str, float]) -> RolloutSample:
    return sample.model_copy(update={"metrics": {**sample.metrics, **metrics}}) if metrics else sample


def _graded(
    reading: TrialReading,
    focus: _Focus,
    exc_type: str | None,
    reward_source: str,
    label: str | None,
    agent_sample: RolloutSample | None,
    extra: dict[str, Any],
) -> ExecutionResult:
    """The verifier's half of the outcome: the graded sample, or why there is none."""
    claim = (
        _read_claim(focus.trial_dir, focus.verifier / contract.ERROR_FILENAME, focus.bounds)
        if reward_source == RewardSource.GRADER
        else None
    )
    if exc_type is not None or claim is not None:  # the verifier phase failed
        # A grader that failed has failed, whatever reward file exists beside its error.
        category, message = verifier_failure(exc_type, reading, claim)
        return _failure(message, category, agent_sample, {**extra, "failed_phase": TrialPhase.VERIFIER.value})

    reward = reading.reward
    if reward is None:
        channels = ", ".join(sorted(reading.rewards))
        message = (
            "the verifier produced no reward"
            if not reading.rewards
            else f'the verifier wrote several reward channels ({channels}) and no "reward": '
            'add a "reward" key to reward.json to say which one trains the policy'
        )
        if agent_sample is not None:
            agent_sample = agent_sample.model_copy(
                update={"metrics": {**agent_sample.metrics, **_reward_metrics(reading)}}
            )
        extra = {**extra, "failed_phase": TrialPhase.VERIFIER.value}
        return _failure(message, RolloutErrorCategory.AGENT_ERROR, agent_sample, extra)
    graded = None
    if reward_source == RewardSource.GRADER:
        try:
            graded = load_sample(focus.trial_dir, focus.verifier / contract.SAMPLE_FILENAME, focus.bounds)
        except ContractFileError as exc:
            extra = {**extra, "failed_phase": TrialPhase.VERIFIER.value}
            return _failure(str(exc), RolloutErrorCategory.VALIDATION_ERROR, agent_sample, extra)
    if graded is None:
        base = agent_sample or RolloutSample()
        graded = base.model_copy(update={"reward": reward})
    else:
        updates: dict[str, Any] = {"reward": reward}
        if graded.label is None and label is not None:
            updates["label"] = label
        graded = graded.model_copy(update=updates)
    if extra_metrics := _reward_metrics(reading):
        graded = graded.model_copy(update={"metrics": {**graded.metrics, **extra_metrics}})
    return ExecutionResult(status=RolloutStatus.SUCCESS, sample=graded, extra_fields=extra)


@dataclass(frozen=True)
class _Focus:
    """Where the products of the step that matters are (relative to ``trial_dir``), and
    what the host measured and set for its agent phase."""

    trial_dir: Path
    agent: PurePosixPath
    verifier: PurePosixPath
    step: str | None
    agent_sec: float | None
    agent_deadline_sec: float | None
    bounds: ContractBounds  # the backend's: what its files are read within


def _focus(reading: TrialReading, trial_dir: Path, agent_deadline_sec: float | None, bounds: ContractBounds) -> _Focus:
    """The trial's own dirs for a single-step trial; for a multi-step one, the failing step's
    (else the last step that ran), which Harbor archives under ``steps/<name>/``."""
    agent, verifier = PurePosixPath("agent"), PurePosixPath("verifier")
    ran = [s for s in reading.steps or [] if s.ran]
    focus = next((s for s in ran if s.failed_phase is not None), ran[-1] if ran else None)
    if focus is None:
        agent_sec = reading.timings_sec.get(TrialPhase.AGENT.value)
        return _Focus(trial_dir, agent, verifier, None, agent_sec, agent_deadline_sec, bounds)
    step_dir = PurePosixPath("steps", focus.name)
    agent_sec = focus.timings_sec.get(TrialPhase.AGENT.value)
    return _Focus(trial_dir, step_dir / agent, step_dir / verifier, focus.name, agent_sec, agent_deadline_sec, bounds)


def _reward_metrics(reading: TrialReading) -> dict[str, float]:
    """The reward channels besides the primary one (``reward/<name>``) and, for multi-step
    trials, each step's primary reward (``step_reward/<step>``): the sample's metrics."""
    metrics = {
        f"reward/{key}": value
        for key, value in reading.rewards.items()
        if key != "reward" and not (len(reading.rewards) == 1 and reading.reward is not None)
    }
    for step in reading.steps or []:
        if step.ran and step.reward is not None:
            metrics[f"step_reward/{step.name}"] = step.reward
    return metrics
