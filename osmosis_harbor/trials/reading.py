"""Reading a Harbor ``TrialResult``: which phase failed, why, the reward and timings.

Harbor records failures in several places: an exception on the trial (environment build
or start, agent setup, agent timeout, missing reward file), a reward below 1 that is not
an exception at all, and, for the oracle agent, a non-zero ``solve.sh`` exit written to
``agent/exit-code.txt`` with no exception. Both ``validate`` and ``HarborBackend`` need
one honest reading of all of them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePosixPath

from harbor.models.trial.result import ExceptionInfo, StepResult, TimingInfo, TrialResult
from harbor.models.verifier.result import VerifierResult
from pydantic import BaseModel

from osmosis_harbor.errors import ContractFileError, SandboxLostError, recorded_error
from osmosis_harbor.tasks.verifier import task_step_names
from osmosis_harbor.trials.contract_files import ContractBounds, FileKind, read_text
from osmosis_harbor.trials.printable import json_safe


class TrialPhase(StrEnum):
    """Where a trial failed, in the order a trial runs."""

    TASK = "task"  # the task itself is invalid (reported before any sandbox starts)
    ENVIRONMENT = "environment"  # image build/push, sandbox create/start
    AGENT_SETUP = "agent_setup"
    AGENT = "agent"
    VERIFIER = "verifier"
    CANCELLED = "cancelled"


class StepReading(BaseModel):
    """One step of a multi-step trial: its rewards, and what stopped it if anything did.

    ``ran`` is False for a step Harbor never started (an earlier step failed, or fell
    below its ``min_reward``)."""

    name: str
    ran: bool = True
    reward: float | None = None
    rewards: dict[str, float] = {}
    failed_phase: TrialPhase | None = None
    error: str | None = None
    exception_type: str | None = None
    timings_sec: dict[str, float] = {}


class TrialReading(BaseModel):
    """What a trial result says, flattened for tables, JSON reports and outcomes.

    For a multi-step trial ``reward``/``rewards`` are Harbor's aggregate (the task's
    ``multi_step_reward_strategy``) and ``steps`` holds one reading per declared step;
    ``failed_phase``/``error`` then name the first step that failed. ``steps`` is None
    for single-step trials."""

    reward: float | None
    rewards: dict[str, float] = {}
    failed_phase: TrialPhase | None = None
    error: str | None = None
    exception_type: str | None = None
    timings_sec: dict[str, float] = {}
    steps: list[StepReading] | None = None


# Harbor records one exception per trial but may run later phases after it (an agent
# timeout is still verified), so the exception type, not the last phase that started,
# says where the trial failed whenever the type tells us. Harbor's own exceptions are
# known here by name (they are Harbor's types); ours carry their phase (``errors``).
_HARBOR_PHASE_OF_EXCEPTION: dict[str, TrialPhase] = {
    "EnvironmentStartTimeoutError": TrialPhase.ENVIRONMENT,
    "AgentSetupTimeoutError": TrialPhase.AGENT_SETUP,
    "AgentTimeoutError": TrialPhase.AGENT,
    "VerifierTimeoutError": TrialPhase.VERIFIER,
    "RewardFileNotFoundError": TrialPhase.VERIFIER,
    "RewardFileEmptyError": TrialPhase.VERIFIER,
    "VerifierOutputParseError": TrialPhase.VERIFIER,
    "AddTestsDirError": TrialPhase.VERIFIER,
    "DownloadVerifierDirError": TrialPhase.VERIFIER,
    "CancelledError": TrialPhase.CANCELLED,
    # multi-step: a step's healthcheck or setup.sh prepares the sandbox for that step
    "HealthcheckError": TrialPhase.ENVIRONMENT,
}
# Harbor's timeouts: the rollout failed for lack of time, whatever phase it was in.
TIMEOUT_EXCEPTIONS = frozenset(
    {
        "AgentTimeoutError",
        "VerifierTimeoutError",
        "AgentSetupTimeoutError",
        "EnvironmentStartTimeoutError",
    }
)


def phase_of_exception(exception_type: str | None) -> TrialPhase | None:
    """The phase an exception recorded on a trial stops, when its type says so."""
    ours = recorded_error(exception_type)
    if ours is not None:
        return TrialPhase(ours.phase) if ours.phase is not None else None
    return _HARBOR_PHASE_OF_EXCEPTION.get(exception_type or "")


_PHASE_FIELDS: tuple[tuple[str, TrialPhase], ...] = (
    ("environment_setup", TrialPhase.ENVIRONMENT),
    ("agent_setup", TrialPhase.AGENT_SETUP),
    ("agent_execution", TrialPhase.AGENT),
    ("verifier", TrialPhase.VERIFIER),
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


def _last_started_phase(result: TrialResult) -> TrialPhase:
    last = TrialPhase.ENVIRONMENT
    for field, phase in _PHASE_FIELDS:
        timing = getattr(result, field)
        if timing is not None and timing.started_at is not None:
            last = phase
    return last


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def phase_at(result: TrialResult, moment: datetime) -> TrialPhase:
    """The phase the trial was in at ``moment``: the last one (of the trial's, or of any step's)
    that had started by then. Harbor's agent timing ends before it downloads the agent's outputs,
    so a moment between the agent's end and the verifier's start is still the agent's."""
    timings = [(getattr(result, field), phase) for field, phase in _PHASE_FIELDS]
    for step in result.step_results or []:
        timings += [(step.agent_execution, TrialPhase.AGENT), (step.verifier, TrialPhase.VERIFIER)]
    started = [(_utc(t.started_at), phase) for t, phase in timings if t is not None and t.started_at is not None]
    moment = _utc(moment)
    before = [(at, phase) for at, phase in started if at <= moment]
    return max(before, key=lambda item: item[0])[1] if before else TrialPhase.ENVIRONMENT


def agent_had_ended(result: TrialResult, moment: datetime) -> bool:
    """Whether the last agent run that had started by ``moment`` (the trial's, or a step's) had
    also ended by then: Harbor was collecting the agent's outputs, not running it."""
    runs = [result.agent_execution, *(step.agent_execution for step in result.step_results or [])]
    moment = _utc(moment)
    started = [t for t in runs if t is not None and t.started_at is not None and _utc(t.started_at) <= moment]
    last = max(started, key=lambda t: _utc(t.started_at), default=None)  # type: ignore[arg-type]
    return last is not None and last.finished_at is not None and _utc(last.finished_at) <= moment


def _phase_of_unnamed(result: TrialResult, exc: ExceptionInfo) -> TrialPhase:
    """The phase of an exception whose type names none: for a lost sandbox, the phase when the
    host saw the loss (``backend.losses`` records that moment); else the last that started."""
    ours = recorded_error(exc.exception_type)
    if ours is not None and issubclass(ours, SandboxLostError):
        return phase_at(result, exc.occurred_at)
    return _last_started_phase(result)


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


DETAIL_LINES = 24  # of an error whose further lines explain it (a build's output tail, pip's)


def _error_text(exc: ExceptionInfo) -> str:
    """The error a reading reports: the message's first line, and for our errors whose further
    lines explain them (``TrialPhaseError.detailed``) those lines too, bounded."""
    head = _one_line(exc.exception_message) or exc.exception_type
    ours = recorded_error(exc.exception_type)
    if ours is None or not ours.detailed:
        return json_safe(f"{exc.exception_type}: {head}")
    rest = [line.rstrip() for line in exc.exception_message.strip().splitlines()[1:DETAIL_LINES]]
    return json_safe("\n".join([f"{exc.exception_type}: {head}", *rest]))


def _float_rewards(verifier_result: VerifierResult | None) -> dict[str, float]:
    """The reward channels Harbor parsed from the sandbox's ``reward.json``: their names are
    sandbox text, which reaches the host here rather than through ``contract_files``, so a lone
    surrogate in one is spelled here (a channel becomes a metric key of the result)."""
    rewards = (verifier_result and verifier_result.rewards) or {}
    return {json_safe(str(k)): float(v) for k, v in rewards.items()}


def _oracle_exit_code(trial_dir: Path, agent_dir: PurePosixPath, bounds: ContractBounds) -> str | None:
    """Harbor's oracle writes ``exit-code.txt`` (and raises nothing) when ``solve.sh`` fails.
    The sandbox wrote it, so it is read as any contract file is (``contract_files``)."""
    try:
        text = read_text(trial_dir, agent_dir / "exit-code.txt", FileKind.REWARD, bounds)
    except ContractFileError as exc:
        return f"unknown ({exc})"
    return None if text is None else text.strip()[:100]


def _step_phase(step: StepResult) -> TrialPhase:
    exc = step.exception_info
    assert exc is not None
    if (phase := phase_of_exception(exc.exception_type)) is not None:
        return phase
    if "setup.sh" in exc.exception_message:  # Harbor raises a RuntimeError for a failing step setup
        return TrialPhase.ENVIRONMENT
    if step.verifier is not None and step.verifier.started_at is not None:
        return TrialPhase.VERIFIER
    return TrialPhase.AGENT if step.agent_execution is not None else TrialPhase.ENVIRONMENT


def read_step(step: StepResult, trial_dir: Path, bounds: ContractBounds) -> StepReading:
    """One step's reading; its oracle exit code lives under ``steps/<name>/agent/``."""
    rewards = _float_rewards(step.verifier_result)
    timings = {
        phase.value: seconds
        for phase, timing in ((TrialPhase.AGENT, step.agent_execution), (TrialPhase.VERIFIER, step.verifier))
        if (seconds := _seconds(timing)) is not None
    }
    reading = StepReading(name=step.step_name, reward=primary_reward(rewards), rewards=rewards, timings_sec=timings)
    if step.exception_info is not None:
        exc = step.exception_info
        reading.failed_phase = _step_phase(step)
        reading.error = _error_text(exc)
        reading.exception_type = exc.exception_type
        return reading
    code = _oracle_exit_code(trial_dir, PurePosixPath("steps", step.step_name, "agent"), bounds)
    if code is not None:
        reading.failed_phase = TrialPhase.AGENT
        reading.error = f"solve.sh exited with status {code}"
    return reading


def read_steps(result: TrialResult, trial_dir: Path, bounds: ContractBounds) -> list[StepReading] | None:
    """Readings for every step the task declares, in order (None for a single-step task).

    Steps Harbor did not start are listed with ``ran=False``, so that a report can never
    mistake "two of three steps passed, the third never ran" for a pass."""
    declared = (result.config.task and _declared_steps(result)) or []
    if not declared and not result.step_results:
        return None
    ran = {step.step_name: read_step(step, trial_dir, bounds) for step in result.step_results or []}
    names = declared or list(ran)
    return [ran.get(name) or StepReading(name=name, ran=False) for name in names]


def _declared_steps(result: TrialResult) -> list[str]:
    """The names of the task's ``[[steps]]`` as Harbor loaded them for this trial (the task copy
    on disk; its parse is shared with the plan's, ``task_step_names``)."""
    path = result.config.task.path
    if path is None or not (Path(path) / "task.toml").is_file():
        return []
    try:
        return task_step_names(Path(path))
    except Exception:  # the trial ran from it; if it is gone or changed, fall back to what ran
        return []


def read_trial(result: TrialResult, trial_dir: Path, bounds: ContractBounds) -> TrialReading:
    """Interpret ``result`` (and the trial directory's agent exit codes, if any, read within
    ``bounds``: the reader's)."""
    rewards = _float_rewards(result.verifier_result)
    reward = primary_reward(rewards)
    timings = phase_timings(result)
    steps = read_steps(result, trial_dir, bounds)
    exc = result.exception_info
    if exc is not None:
        phase = phase_of_exception(exc.exception_type) or _phase_of_unnamed(result, exc)
        return TrialReading(
            reward=reward,
            rewards=rewards,
            failed_phase=phase,
            error=_error_text(exc),
            exception_type=exc.exception_type,
            timings_sec=timings,
            steps=steps,
        )
    if steps is not None:
        failed = next((s for s in steps if s.failed_phase is not None), None)
        return TrialReading(
            reward=reward,
            rewards=rewards,
            timings_sec=timings,
            steps=steps,
            failed_phase=failed.failed_phase if failed else None,
            error=f"step {failed.name}: {failed.error}" if failed else None,
            exception_type=failed.exception_type if failed else None,
        )
    code = _oracle_exit_code(trial_dir, PurePosixPath("agent"), bounds)
    if code is not None:
        return TrialReading(
            reward=reward,
            rewards=rewards,
            failed_phase=TrialPhase.AGENT,
            error=f"solve.sh exited with status {code}",
            timings_sec=timings,
        )
    return TrialReading(reward=reward, rewards=rewards, timings_sec=timings)
