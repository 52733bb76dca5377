"""The verdict rules of dataset validation: when does a trial count as a pass?

One place for the rules the README's table states, so ``validate``'s table, JSON and JUnit
report agree with each other and with the documentation:

* ``oracle`` (reference solutions must work): ``"reward"`` must be 1 when the verifier
  writes it; a verifier that writes only other channels (``{"correctness": 1,
  "performance": 1}``) must give 1 on every channel.
* ``nop`` (an untouched sandbox must fail): every channel must be 0.
* A multi-step task passes only when every declared step ran, its ``solve.sh`` exited 0
  and its own rewards meet the rule above (under ``nop``: steps that Harbor skipped after
  an earlier step fell short are fine). Harbor's aggregate reward (mean or final) is
  reported, never judged: a mean of 1.0 over the steps that ran says nothing about the
  step that did not.
"""

from __future__ import annotations

from pydantic import BaseModel

from osmosis_harbor.trials.reading import StepReading, TrialPhase, TrialReading

EXPECTED_REWARD: dict[str, float] = {"oracle": 1.0, "nop": 0.0}


class StepVerdict(BaseModel):
    """One step of a multi-step task, as the JSON report shows it."""

    name: str
    ran: bool
    passed: bool
    reward: float | None = None
    rewards: dict[str, float] = {}
    failed_phase: str | None = None
    error: str | None = None
    timings_sec: dict[str, float] = {}


class Verdict(BaseModel):
    passed: bool
    failed_phase: str | None = None
    error: str | None = None
    steps: list[StepVerdict] | None = None


def reward_shortfall(rewards: dict[str, float], expected: float) -> str | None:
    """Why ``rewards`` miss ``expected`` (None when they meet it), naming the channels."""
    if not rewards:
        return "no reward produced"
    judged = {"reward": rewards["reward"]} if expected == 1.0 and "reward" in rewards else rewards
    short = {key: value for key, value in judged.items() if value != expected}
    if not short:
        return None
    if list(short) == ["reward"]:
        return f"reward {short['reward']:g} (expected {expected:g})"
    channels = ", ".join(f"{key}={value:g}" for key, value in sorted(short.items()))
    return f"reward {channels} (expected {expected:g})"


def _judge_step(step: StepReading, expected: float, *, skip_ok: bool) -> StepVerdict:
    verdict = StepVerdict(
        name=step.name,
        ran=step.ran,
        passed=False,
        reward=step.reward,
        rewards=step.rewards,
        timings_sec=step.timings_sec,
    )
    if not step.ran:
        verdict.passed = skip_ok
        verdict.error = None if skip_ok else "did not run (an earlier step stopped the trial)"
        verdict.failed_phase = None if skip_ok else TrialPhase.AGENT.value
        return verdict
    if step.failed_phase is not None:
        verdict.failed_phase, verdict.error = step.failed_phase.value, step.error
        return verdict
    shortfall = reward_shortfall(step.rewards, expected)
    if shortfall is not None:
        verdict.failed_phase, verdict.error = TrialPhase.VERIFIER.value, shortfall
        return verdict
    verdict.passed = True
    return verdict


def judge(reading: TrialReading, agent: str) -> Verdict:
    """The verdict on one trial of ``agent`` (``oracle`` or ``nop``)."""
    expected = EXPECTED_REWARD[agent]
    if reading.steps is None:
        if reading.failed_phase is not None:
            return Verdict(passed=False, failed_phase=reading.failed_phase.value, error=reading.error)
        shortfall = reward_shortfall(reading.rewards, expected)
        if shortfall is None:
            return Verdict(passed=True)
        return Verdict(passed=False, failed_phase=TrialPhase.VERIFIER.value, error=shortfall)

    steps = [_judge_step(step, expected, skip_ok=agent == "nop") for step in reading.steps]
    problems = [f"step {s.name}: {s.error}" for s in steps if not s.passed]
    first = next((s for s in steps if not s.passed), None)
    first_phase: str | None
    if reading.failed_phase is not None and reading.error and not reading.error.startswith("step "):
        # the trial itself failed (environment start, cancellation) before or around the steps
        problems.insert(0, reading.error)
        first_phase = reading.failed_phase.value
    else:
        first_phase = first.failed_phase if first else None
    if not problems:
        return Verdict(passed=True, steps=steps)
    return Verdict(passed=False, failed_phase=first_phase, error="; ".join(problems), steps=steps)


__all__ = ["EXPECTED_REWARD", "StepVerdict", "Verdict", "judge", "reward_shortfall"]
