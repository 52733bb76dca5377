"""Verifier phase: grade the agent's sample with the bundle's ``Grader``.

Runs from the task's ``tests/test.sh`` after the agent phase. Inputs: the
agent's ``$OSMOSIS_LOGS_DIR/agent/sample.json`` and ``$OSMOSIS_GRADING_INPUT``
(``GradingInput``, which carries the label; it only reaches the sandbox with
``tests/`` at verification time), plus an optional deadline in
``$OSMOSIS_GRADER_TIMEOUT_SEC``.

On success it writes ``verifier/reward.json`` (``{"reward": float}``, what
Harbor reads) and ``verifier/sample.json`` (the graded ``RolloutSample``:
reward plus whatever the grader changed in metrics, extra_fields and
remove_sample). On failure it writes ``verifier/error.json`` and *no*
``reward.json``, so Harbor records a verifier failure instead of a silent 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.rollout import Grader, GraderContext, RolloutSample
from osmosis_ai.rollout.utils.rewards import validate_sample_has_reward

from .atif import TrajectoryError, sample_from_atif_file
from .contract import GRADER_TIMEOUT_ENV
from .errors import AgentSampleError, Redactor
from .files import (
    read_input,
    read_sample,
    sample_payload,
    usable_dir,
    write_json,
    write_model,
)
from .loading import load_config, load_grader
from .models import GradingInput, RewardFile
from .paths import ShimPaths
from .runtime import read_timeout, run_phase, run_with_deadline

# reward.json must hold a number; a sample the grader removed from training
# (remove_sample=True, reward None -- a success for LocalBackend) reports this.
REMOVED_SAMPLE_REWARD = 0.0


async def grade_sample(
    grader_cls: type[Grader],
    config: Any,
    sample: RolloutSample,
    grading_input: GradingInput,
    *,
    artifacts_dir: Path | None,
    budget: float | None,
) -> RolloutSample:
    """Grade like ``LocalBackend.run_grader`` and return the graded sample.

    The agent phase never sees the label, so the sample gets the request's
    label here (LocalBackend stamps it on workflow-built samples; the label
    a sample source set itself is kept). ``validate_sample_has_reward``
    (osmosis_ai) rejects a grader that set no reward -- unless it removed the
    sample -- and a grader that dropped the sample.
    """
    if sample.label is None and grading_input.label is not None:
        sample.label = grading_input.label
    ctx = GraderContext(
        label=grading_input.label,
        sample=sample,
        metadata=grading_input.metadata,
        artifacts_dir=artifacts_dir,
    )

    async def attempt() -> None:
        grader = grader_cls(config)
        await grader.grade(ctx)
        validate_sample_has_reward(ctx.sample)

    await run_with_deadline(attempt, budget=budget, what="grader")
    graded = ctx.sample
    if not isinstance(graded, RolloutSample):
        raise TypeError(f"grader replaced the sample with {type(graded).__name__}")
    return graded


def read_agent_sample(paths: ShimPaths) -> RolloutSample:
    """The workflow's sample.json, or, for a native Harbor agent (which records an ATIF
    trajectory instead), the sample its trajectory describes."""
    if not paths.agent_sample.exists() and paths.agent_trajectory.is_file():
        try:
            sample = sample_from_atif_file(paths.agent_trajectory)
        except TrajectoryError as exc:
            raise AgentSampleError(str(exc)) from exc
        if sample is not None:
            return sample
    return read_sample(paths.agent_sample)


async def run_verifier(
    paths: ShimPaths,
    redactor: Redactor,
    *,
    grader: str,
    grader_config: str | None,
) -> str:
    """The whole verifier phase; raises on failure (``run_phase`` records it)."""
    grader_cls = load_grader(grader)
    config = load_config(grader_config)
    grading_input = read_input(paths.grading_input, GradingInput)
    sample = read_agent_sample(paths)
    budget = read_timeout(GRADER_TIMEOUT_ENV)
    graded = await grade_sample(
        grader_cls,
        config,
        sample,
        grading_input,
        artifacts_dir=usable_dir(paths.artifacts_dir),
        budget=budget,
    )
    reward = RewardFile(reward=graded.reward if graded.reward is not None else REMOVED_SAMPLE_REWARD)
    # The sample first: whoever sees reward.json may rely on sample.json.
    write_json(paths.verifier_sample, sample_payload(graded), redactor)
    write_model(paths.verifier_reward, reward, redactor)
    return f"rollout_id={grading_input.rollout_id} reward={graded.reward} remove_sample={graded.remove_sample}"


def main(
    *,
    grader: str,
    grader_config: str | None,
    argv: Sequence[str] | None = None,
) -> int:
    """Entry point of the bundle's grade command; returns 0 or 1, never raises.

    ``grader`` and ``grader_config`` are ``"module:attr"`` paths (the config
    is a module-level object, or ``None``). ``argv`` (default
    ``sys.argv[1:]``) accepts ``--logs-dir`` and ``--grading-input``.
    """
    return run_phase(
        "verifier",
        lambda paths, redactor: run_verifier(paths, redactor, grader=grader, grader_config=grader_config),
        argv=argv,
        outputs=lambda p: (p.verifier_reward, p.verifier_sample, p.verifier_error),
        error_path=lambda p: p.verifier_error,
    )


__all__ = ["grade_sample", "main", "run_verifier"]
