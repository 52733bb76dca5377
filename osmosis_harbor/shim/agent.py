"""Agent phase: run ``AgentWorkflow.run`` in the sandbox and leave its sample.

Inputs: ``$OSMOSIS_ROLLOUT_INPUT_JSON`` or the file ``$OSMOSIS_ROLLOUT_INPUT`` (``RolloutInput``: prompt and metadata,
never the label), the chat endpoint in ``$OSMOSIS_CHAT_COMPLETIONS_URL`` and
its key in ``$OSMOSIS_API_KEY`` (environment only, so the key exists in no
file), and an optional deadline in ``$OSMOSIS_AGENT_TIMEOUT_SEC``.

Outputs under ``$OSMOSIS_LOGS_DIR`` (default ``/logs``):
``agent/sample.json`` (a serialized ``RolloutSample``) and a best-effort ATIF
``agent/trajectory.json`` on success, ``agent/error.json`` on failure.

The workflow is driven exactly the way ``LocalBackend.run_workflow`` drives
it, so a workflow behaves the same in-process and in a sandbox.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    RolloutContext,
    RolloutSample,
)
from osmosis_ai.rollout.types.output import coerce_output

from .contract import AGENT_TIMEOUT_ENV, CHAT_URL_ENV, KEY_ENV, ROLLOUT_INPUT_JSON_ENV, environ
from .errors import NoSampleError, Redactor
from .files import read_inline_input, read_input, sample_payload, usable_dir, write_json, write_text
from .loading import load_config, load_workflow
from .models import RolloutInput
from .paths import ShimPaths
from .runtime import read_timeout, run_phase, run_with_deadline

logger: logging.Logger = logging.getLogger(__name__)


def rollout_context(rollout_id: str) -> RolloutContext:
    """The ambient context integrations read the policy endpoint from.

    URL and key come from the environment only; ``OsmosisStrandsAgent`` /
    ``OsmosisAgent`` pick them up from the active context, and the sample
    source they register lands here too.
    """
    return RolloutContext(
        chat_completions_url=environ().get(CHAT_URL_ENV, ""),
        api_key=environ().get(KEY_ENV) or None,
        rollout_id=rollout_id,
    )


async def produce_sample(
    workflow_cls: type[AgentWorkflow[Any]],
    config: Any,
    rollout_input: RolloutInput,
    *,
    artifacts_dir: Path | None,
    budget: float | None,
) -> RolloutSample:
    """Run the workflow once and normalize its result into one sample.

    Normalization is ``LocalBackend``'s: ``coerce_output`` (osmosis_ai) turns
    a message list into ``AgentWorkflowOutput`` and revalidates an output
    instance (unknown fields, non-finite metrics -> ValidationError); ``None``
    falls back to the sample source registered on the rollout context. A run
    that yields no sample at all fails here rather than at grading time, so
    the agent phase's verdict is self-contained.
    """
    ctx = AgentWorkflowContext(
        prompt=rollout_input.prompt,
        config=config,
        metadata=rollout_input.metadata,
        artifacts_dir=artifacts_dir,
    )
    rollout_ctx = rollout_context(rollout_input.rollout_id)
    workflow = workflow_cls(config)

    async def attempt() -> RolloutSample | None:
        with rollout_ctx:
            output = coerce_output(await workflow.run(ctx))
            if output is None:
                return await rollout_ctx.get_sample()
            if output.messages is None:
                return None
            return RolloutSample(messages=output.messages, metrics=dict(output.metrics))

    sample = await run_with_deadline(attempt, budget=budget, what="workflow")
    if sample is None:
        raise NoSampleError(
            "the workflow produced no sample: return AgentWorkflowOutput or a "
            "message list, or register a sample source (e.g. construct "
            "OsmosisStrandsAgent / OsmosisMemorySession inside run())"
        )
    if not isinstance(sample, RolloutSample):
        # A custom SampleSource may hand back a plain mapping; validate it the
        # way ExecutionResult(sample=...) would.
        sample = RolloutSample.model_validate(sample)
    return sample


def write_trajectory(path: Path, sample: RolloutSample, rollout_id: str, redactor: Redactor) -> None:
    """Best-effort ATIF document where Harbor's own agents leave theirs.

    Lets Harbor's trial viewer show the conversation; never fails the phase.
    """
    if sample.trajectory_messages is None:
        return
    try:
        from osmosis_ai.rollout.trajectory.atif import format_trajectory_json
        from osmosis_ai.rollout.trajectory.converter import (
            convert_sample_to_trajectory,
        )

        document = convert_sample_to_trajectory(sample, rollout_id=rollout_id)
        write_text(path, format_trajectory_json(redactor.data(document.to_json_dict())))
    except Exception as exc:
        logger.warning("trajectory.json not written (best-effort): %s", redactor.text(str(exc)))


async def run_agent(
    paths: ShimPaths,
    redactor: Redactor,
    *,
    workflow: str,
    workflow_config: str | None,
) -> str:
    """The whole agent phase; raises on failure (``run_phase`` records it)."""
    workflow_cls = load_workflow(workflow)
    config = load_config(workflow_config)
    rollout_input = (
        read_inline_input(paths.rollout_input_json, RolloutInput, ROLLOUT_INPUT_JSON_ENV)
        if paths.rollout_input_json is not None
        else read_input(paths.rollout_input, RolloutInput)
    )
    budget = read_timeout(AGENT_TIMEOUT_ENV)
    sample = await produce_sample(
        workflow_cls,
        config,
        rollout_input,
        artifacts_dir=usable_dir(paths.artifacts_dir),
        budget=budget,
    )
    write_json(paths.agent_sample, sample_payload(sample), redactor)
    write_trajectory(paths.agent_trajectory, sample, rollout_input.rollout_id, redactor)
    return f"rollout_id={rollout_input.rollout_id} messages={len(sample.messages)} metrics={len(sample.metrics)}"


def main(
    *,
    workflow: str,
    workflow_config: str | None,
    argv: Sequence[str] | None = None,
) -> int:
    """Entry point of the bundle's agent command; returns 0 or 1, never raises.

    ``workflow`` and ``workflow_config`` are ``"module:attr"`` paths (the
    config is a module-level object, or ``None``). ``argv`` (default
    ``sys.argv[1:]``) accepts ``--logs-dir`` and ``--rollout-input``.
    """
    return run_phase(
        "agent",
        lambda paths, redactor: run_agent(paths, redactor, workflow=workflow, workflow_config=workflow_config),
        argv=argv,
        outputs=lambda p: (p.agent_sample, p.agent_error, p.agent_trajectory),
        error_path=lambda p: p.agent_error,
    )


__all__ = ["main", "produce_sample", "rollout_context", "run_agent"]
