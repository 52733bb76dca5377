"""Small pieces ``HarborBackend`` needs that are not about one rollout's flow: migration
errors, refusal outcomes, secret scrubbing, and locating a workflow's project."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.types import (
    ExecutionOutcome,
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


def scrub_tree(root: Path, secret: str | None) -> None:
    """Replace ``secret`` in every text file under ``root`` (defence in depth: a workflow
    that prints its key into a log must not leave it in the retained trial)."""
    if not secret or not root.exists():
        return
    needle = secret.encode()
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if needle in data:
                path.write_bytes(data.replace(needle, b"***"))


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
