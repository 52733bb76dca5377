"""Reading a Harbor ``TrialResult``: which phase failed, why, the reward and timings.

Harbor records failures in several places: an exception on the trial (environment build
or start, agent setup, agent timeout, missing reward file), a reward below 1 that is not
an exception at all, and, for the oracle agent, a non-zero ``solve.sh`` exit written to
``agent/exit-code.txt`` with no exception. Both ``validate`` and ``HarborBackend`` need
one honest reading of all of them.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from harbor.models.trial.result import TimingInfo, TrialResult
from pydantic import BaseModel


class Phase(StrEnum):
    """Where a trial failed, in the order a trial runs."""

    TASK = "task"  # the task itself is invalid (reported before any sandbox starts)
    ENVIRONMENT = "environment"  # image build/push, sandbox create/start
    AGENT_SETUP = "agent_setup"
    AGENT = "agent"
    VERIFIER = "verifier"
    CANCELLED = "cancelled"


class TrialReading(BaseModel):
    """What a trial result says, flattened for tables, JSON reports and outcomes."""

    reward: float | None
    rewards: dict[str, float] = {}
    failed_phase: Phase | None = None
    error: str | None = None
    exception_type: str | None = None
    timings_sec: dict[str, float] = {}


# Harbor records one exception per trial but may run later phases after it (an agent
# timeout is still verified), so the exception type, not the last phase that started,
# says where the trial failed whenever Harbor's own types tell us.
_PHASE_OF_EXCEPTION: dict[str, Phase] = {
    "EnvironmentStartTimeoutError": Phase.ENVIRONMENT,
    "ImageBuildError": Phase.ENVIRONMENT,
    "AgentSetupTimeoutError": Phase.AGENT_SETUP,
    "BundleInstallError": Phase.AGENT_SETUP,
    "IncompatibleTaskImageError": Phase.AGENT_SETUP,
    "AgentTimeoutError": Phase.AGENT,
    "WorkflowFailedError": Phase.AGENT,
    "VerifierTimeoutError": Phase.VERIFIER,
    "RewardFileNotFoundError": Phase.VERIFIER,
    "RewardFileEmptyError": Phase.VERIFIER,
    "VerifierOutputParseError": Phase.VERIFIER,
    "AddTestsDirError": Phase.VERIFIER,
    "DownloadVerifierDirError": Phase.VERIFIER,
    "CancelledError": Phase.CANCELLED,
}
_PHASE_FIELDS: tuple[tuple[str, Phase], ...] = (
    ("environment_setup", Phase.ENVIRONMENT),
    ("agent_setup", Phase.AGENT_SETUP),
    ("agent_execution", Phase.AGENT),
    ("verifier", Phase.VERIFIER),
)


def _seconds(timing: TimingInfo | None) -> float | None:
    if timing is None or timing.started_at is None or timing.finished_at is None:
        return None
    return round((timing.finished_at - timing.started_at).total_seconds(), 3)


def phase_timings(result: TrialResult) -> dict[str, float]:
    """Seconds spent per phase, plus the whole trial, for phases that ran."""
    timings: dict[str, float] = {}
    for field, phase in _PHASE_FIELDS:
        seconds = _seconds(getattr(result, field))
        if seconds is not None:
            timings[phase.value] = seconds
    if result.started_at and result.finished_at:
        timings["total"] = round((result.finished_at - result.started_at).total_seconds(), 3)
    return timings


def _last_started_phase(result: TrialResult) -> Phase:
    last = Phase.ENVIRONMENT
    for field, phase in _PHASE_FIELDS:
        timing = getattr(result, field)
        if timing is not None and timing.started_at is not None:
            last = phase
    return last


def primary_reward(rewards: dict[str, float] | None) -> float | None:
    """The trial's scalar reward: ``reward`` if present, else the only value."""
    if not rewards:
        return None
    if "reward" in rewards:
        return float(rewards["reward"])
    if len(rewards) == 1:
        return float(next(iter(rewards.values())))
    return None


def _one_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def read_trial(result: TrialResult, trial_dir: Path | None = None) -> TrialReading:
    """Interpret ``result`` (and the trial directory's agent exit code, if any)."""
    rewards = {
        k: float(v) for k, v in ((result.verifier_result and result.verifier_result.rewards) or {}).items()
    }
    reward = primary_reward(rewards)
    timings = phase_timings(result)
    exc = result.exception_info
    if exc is not None:
        phase = _PHASE_OF_EXCEPTION.get(exc.exception_type) or _last_started_phase(result)
        message = _one_line(exc.exception_message) or exc.exception_type
        return TrialReading(
            reward=reward,
            rewards=rewards,
            failed_phase=phase,
            error=f"{exc.exception_type}: {message}",
            exception_type=exc.exception_type,
            timings_sec=timings,
        )
    exit_code_file = (trial_dir or Path(result.trial_uri.removeprefix("file://"))) / "agent" / "exit-code.txt"
    if exit_code_file.is_file():
        code = exit_code_file.read_text().strip()
        return TrialReading(
            reward=reward,
            rewards=rewards,
            failed_phase=Phase.AGENT,
            error=f"solve.sh exited with status {code}",
            timings_sec=timings,
        )
    return TrialReading(reward=reward, rewards=rewards, timings_sec=timings)
