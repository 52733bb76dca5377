"""Small pieces ``HarborBackend`` needs that are not about one rollout's flow: migration
errors, refusal outcomes, requests refused at admission, and locating a workflow's project."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.types import (
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    RolloutErrorCategory,
    RolloutStatus,
)

LEGACY_KWARGS = {
    "task_dir": "use tasks_dir= together with task_mode='template' (one task) or 'dataset'",
    "user_code_dir": "use code_dir= (a project with pyproject.toml) or bundle= (a prebuilt wheel)",
    "workflow": "use agent= (an AgentWorkflow class or import path, or a native Harbor agent name)",
    "custom_tests_dir": "put the tests in each task's tests/ and pass grader=None, or pass an Osmosis grader=",
    "prebuild_local_image": "images are cached by Harbor: call prewarm() or use prewarm_lifespan() before serving",
    "symlink_environment": "each rollout now materializes its own task copy; remove the argument",
}


def legacy_error(names: Sequence[str]) -> TypeError:
    hints = "; ".join(f"{n}=: {LEGACY_KWARGS[n]}" for n in names)
    return TypeError(
        f"HarborBackend no longer accepts {', '.join(n + '=' for n in names)} (pre-v0.3 constructor). "
        f"Migrate: {hints}. See the v0.3 migration guide."
    )


def cancelled_outcome(extra: dict[str, Any]) -> ExecutionOutcome:
    return ExecutionOutcome(workflow=ExecutionResult(
        status=RolloutStatus.CANCELLED, err_message="cancelled", extra_fields=extra))


def preload_model_client() -> None:
    """Import Harbor's LiteLLM configuration now, not on the first trial.

    ``Trial.create`` imports litellm synchronously (seconds), which would block the
    server's event loop during its first rollout; the constructor runs before serving."""
    try:
        import harbor.llms.litellm_config  # noqa: F401
    except ImportError:
        pass


def refused(message: str, extra: dict[str, Any],
             category: RolloutErrorCategory = RolloutErrorCategory.VALIDATION_ERROR) -> ExecutionOutcome:
    return ExecutionOutcome(workflow=ExecutionResult(
        status=RolloutStatus.FAILURE, err_message=message, err_category=category, extra_fields=extra))


# The rollout id reaches the sandbox as ``OSMOSIS_ROLLOUT_ID=<id>`` in the workflow's exec
# environment; Linux caps one environment string at 128 KiB (MAX_ARG_STRLEN), NUL included.
MAX_ROLLOUT_ID_BYTES = 32 * 4096 - len("OSMOSIS_ROLLOUT_ID=") - 1


def request_problem(request: ExecutionRequest) -> str | None:
    """Why ``request`` cannot succeed, found before any sandbox starts (else None).

    Harbor reads a zero timeout as "the task's default" and starts a sandbox for a negative
    one only to time it out, so a deadline must be a positive number of seconds (None: the
    task's own). Every id the osmosis server accepts works (paths derive from the trial
    name), except one too long to reach the sandbox at all."""
    for name in ("agent_timeout_sec", "grader_timeout_sec"):
        value = getattr(request, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            return f"{name} must be a positive number of seconds (omit it for the task's own timeout), got {value}"
    size = len(request.id.encode("utf-8", "surrogatepass"))
    if size > MAX_ROLLOUT_ID_BYTES:
        return (f"rollout_id is {size} bytes long; at most {MAX_ROLLOUT_ID_BYTES} fit in the sandbox's "
                "OSMOSIS_ROLLOUT_ID environment variable")
    return None


def locate_project(target: str | type) -> Path:
    """The project (directory with pyproject.toml) that contains ``target``'s module."""
    import importlib.util
    import inspect

    if isinstance(target, str):
        module = target.split(":", 1)[0]
        spec = importlib.util.find_spec(module)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
    else:
        source = inspect.getsourcefile(target)
        origin = Path(source) if source else None
    if origin is None:
        raise ValueError(f"cannot locate the project of {target!r}: pass code_dir= explicitly")
    for parent in origin.resolve().parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    raise ValueError(f"no pyproject.toml above {origin}: pass code_dir= pointing at the workflow project")
