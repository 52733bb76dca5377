"""A validation verdict with its cause attached: the output that explains a failure.

``judge`` decides from rewards and phases alone; ``explain`` then reads the trial directory
(``trials.evidence``) to add the tail of the verifier's or ``solve.sh``'s output to a failed
verdict, and applies the rule that a verifier which never ran its tests fails under ``oracle``
and under ``nop`` alike (a reward of 0 from a broken ``test.sh`` proves nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from osmosis_harbor.trials.evidence import host_secrets, output_tail, runner_never_started
from osmosis_harbor.trials.reading import TrialPhase, TrialReading
from osmosis_harbor.trials.verdict import StepVerdict, Verdict

__all__ = ["DID_NOT_RUN", "explain"]

DID_NOT_RUN = "verifier did not run its tests"


def _with_output(error: str, what: str, tail: str | None) -> str:
    """``error``, then the output's tail under a header line (the error's first line stays the
    one-line summary a table or a step list shows)."""
    if not tail:
        return error
    return f"{error}\n--- {what} (last lines) ---\n{tail}"


def _joined(steps: Sequence[StepVerdict]) -> str:
    """One summary line naming each failed step, then each step's output tail."""
    heads, details = [], []
    for step in steps:
        head, _, rest = (step.error or "failed").partition("\n")
        heads.append(f"step {step.name}: {head}")
        if rest:
            details.append(rest)
    return "\n".join(["; ".join(heads), *details])


def _explained(
    passed: bool,
    failed_phase: str | None,
    error: str | None,
    ran_verifier: bool,
    rewards: dict[str, float],
    base: Path,
    secrets: Sequence[str],
    label: str = "",
) -> tuple[bool, str | None, str | None]:
    """(passed, failed_phase, error) for one trial or one step (``label``: ``step NAME: ``) whose
    files live under ``base``."""
    verifier = base / "verifier"
    if (ran_verifier and failed_phase is None) or failed_phase == TrialPhase.VERIFIER.value:
        line = runner_never_started(verifier, rewards, secrets)
        if line is not None:
            tail = output_tail(verifier / "test-stdout.txt", secrets)
            return (
                False,
                TrialPhase.VERIFIER.value,
                _with_output(f"{DID_NOT_RUN} ({line})", f"{label}verifier output", tail),
            )
    if passed or error is None:
        return passed, failed_phase, error
    if failed_phase == TrialPhase.VERIFIER.value:
        error = _with_output(error, f"{label}verifier output", output_tail(verifier / "test-stdout.txt", secrets))
    elif failed_phase == TrialPhase.AGENT.value and error.startswith("solve.sh exited"):
        error = _with_output(error, f"{label}solve.sh output", output_tail(base / "agent" / "oracle.txt", secrets))
    return passed, failed_phase, error


def _step(step: StepVerdict, trial_dir: Path, secrets: Sequence[str]) -> StepVerdict:
    if not step.ran:
        return step
    base = trial_dir / "steps" / step.name
    passed, phase, error = _explained(
        step.passed, step.failed_phase, step.error, True, step.rewards, base, secrets, f"step {step.name}: "
    )
    return step.model_copy(update={"passed": passed, "failed_phase": phase, "error": error})


def explain(verdict: Verdict, reading: TrialReading, trial_dir: Path) -> Verdict:
    """``verdict`` with the output behind a failure, and the did-not-run rule applied."""
    secrets = host_secrets()
    if verdict.steps is None:
        ran_verifier = reading.failed_phase is None
        passed, phase, error = _explained(
            verdict.passed, verdict.failed_phase, verdict.error, ran_verifier, reading.rewards, trial_dir, secrets
        )
        return Verdict(passed=passed, failed_phase=phase, error=error)
    steps = [_step(step, trial_dir, secrets) for step in verdict.steps]
    failed = [s for s in steps if not s.passed]
    if not failed:
        return verdict.model_copy(update={"steps": steps})
    if verdict.passed or (verdict.error or "").startswith("step "):
        return Verdict(passed=False, failed_phase=failed[0].failed_phase, error=_joined(failed), steps=steps)
    return verdict.model_copy(update={"steps": steps})
