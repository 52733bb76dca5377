"""``HarborBackend``'s constructor options: one model, checked before anything is built, and the
migration of pre-v0.3 keyword arguments.

The checks run before the model is made so that each bad value is named in one actionable line
(an ``OsmosisHarborError`` that the command line prints and a server start-up shows), not in a
multi-line validation report.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, TypedDict

from harbor.models.trial.config import EnvironmentConfig
from harbor.trial.queue import TrialQueue
from pydantic import BaseModel, ConfigDict

from osmosis_harbor import settings
from osmosis_harbor.agents.native import DEFAULT_MODEL_NAME, NATIVE_AGENTS
from osmosis_harbor.errors import (
    ConfigError,
    LegacyArgumentError,
    UnexpectedArgumentError,
)
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.tasks.refs import TaskMode

__all__ = ["LEGACY_KWARGS", "BackendKwargs", "BackendOptions", "locate_project"]

LEGACY_KWARGS = {
    "task_dir": "use tasks_dir= together with task_mode='template' (one task) or 'dataset'",
    "user_code_dir": "use code_dir= (a project with pyproject.toml) or bundle= (a prebuilt wheel)",
    "workflow": "use agent= (an AgentWorkflow class or import path, or a native Harbor agent name)",
    "custom_tests_dir": "put the tests in each task's tests/ and pass grader=None, or pass an Osmosis grader=",
    "prebuild_local_image": "images are cached by Harbor: call prewarm() or use prewarm_lifespan() before serving",
    "symlink_environment": "each rollout now materializes its own task copy; remove the argument",
}


class BackendKwargs(TypedDict, total=False):
    """The v0.3 keywords of ``HarborBackend(...)``, spelled out for editors and type checkers
    (``BackendOptions`` checks them at run time, legacy names included)."""

    orchestrator: TrialQueue
    tasks_dir: Path
    task_mode: TaskMode | str
    agent: str | type
    workflow_config: Any
    grader: str | type | None
    grader_config: Any
    code_dir: Path | None
    bundle: Path | None
    native_agent_kwargs: dict[str, Any] | None
    model_name: str
    patch_dockerfile_with_sdk: bool
    agent_setup_timeout_sec: float | None
    max_queue_depth: int | None
    environment_config: EnvironmentConfig | None
    trials_dir: Path | None
    cleanup_successful_trials: bool
    bundles_dir: Path | None
    grader_inputs: Sequence[str]
    infra_retries: int
    task_roots: Sequence[Path] | None
    allow_local_git: bool | None
    allow_private_git_hosts: bool | None
    max_concurrent_starts: int | None
    override_error_policy: Mapping[str, Any] | None
    workers: int | None


class _ConfigError(ConfigError, TypeError):
    """A wrong type where the constructor has always said ``TypeError``."""


class BackendOptions(BaseModel):
    """Everything ``HarborBackend(...)`` accepts (see the README's "Rollouts" section)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    orchestrator: TrialQueue
    tasks_dir: Path
    task_mode: TaskMode = TaskMode.TEMPLATE
    agent: str | type
    workflow_config: Any = None
    grader: str | type | None = None
    grader_config: Any = None
    code_dir: Path | None = None
    bundle: Path | None = None
    native_agent_kwargs: dict[str, Any] = {}
    model_name: str = DEFAULT_MODEL_NAME
    patch_dockerfile_with_sdk: bool = True
    agent_setup_timeout_sec: float | None = None
    max_queue_depth: int | None = None
    environment_config: EnvironmentConfig | None = None
    trials_dir: Path | None = None
    cleanup_successful_trials: bool = True
    bundles_dir: Path | None = None
    grader_inputs: tuple[str, ...] = ()
    # Default 0: a retry runs the workflow again under the same rollout id, so the policy
    # endpoint sees the chat calls of both attempts; opt in where the trainer tolerates that.
    infra_retries: int = 0
    # Where a request's local harbor_task may live besides tasks_dir, and whether its git refs
    # may name this machine's repositories or hosts that are not public; None: the settings
    # decide (see settings.py).
    task_roots: tuple[Path, ...] | None = None
    allow_local_git: bool | None = None
    allow_private_git_hosts: bool | None = None
    # None: the sandbox SDK's own default (``SandboxImplementation.max_concurrent_starts``).
    max_concurrent_starts: int | None = None
    # Harbor 0.26's per-type policy changes (exception type name to ``ErrorPolicyOverride``):
    # passed to every trial, and a ``should_retry=False`` there stops our ``infra_retries`` too.
    override_error_policy: dict[str, Any] = {}
    # Worker processes the trials run in (``backend/workers/``); None: ``OSMOSIS_HARBOR_WORKERS``.
    workers: int | None = None
    # The host's settings, read once as the options are made and carried to every part of the
    # backend (not an argument: ``parse`` refuses it).
    settings: settings.Settings

    # Fields that are not constructor arguments.
    INTERNAL: ClassVar[frozenset[str]] = frozenset({"settings"})

    @classmethod
    def parse(cls, **kwargs: Any) -> BackendOptions:
        """Check ``kwargs`` (legacy names, types, ranges) and make the options."""
        unknown = [name for name in kwargs if name not in cls.model_fields or name in cls.INTERNAL]
        legacy = {name: LEGACY_KWARGS[name] for name in unknown if name in LEGACY_KWARGS}
        if legacy:
            raise LegacyArgumentError(legacy)
        if unknown:
            raise UnexpectedArgumentError("HarborBackend", unknown)
        _check(kwargs)
        kwargs["grader_inputs"] = checked_grader_inputs(kwargs.get("grader_inputs", ()))
        if kwargs.get("task_roots") is not None:
            kwargs["task_roots"] = checked_task_roots(kwargs["task_roots"])
        kwargs["task_mode"] = _task_mode(kwargs.get("task_mode", TaskMode.TEMPLATE))
        kwargs["native_agent_kwargs"] = dict(kwargs.get("native_agent_kwargs") or {})
        kwargs["override_error_policy"] = error_policies.checked_overrides(kwargs.get("override_error_policy"))
        return cls(**kwargs, settings=settings.current())

    @property
    def is_native(self) -> bool:
        return isinstance(self.agent, str) and self.agent in NATIVE_AGENTS

    def worker_count(self) -> int:
        """How many worker processes run the trials (1: this process runs them itself)."""
        return self.workers if self.workers is not None else self.settings.workers

    def agent_label(self) -> str:
        return self.agent if isinstance(self.agent, str) else f"{self.agent.__module__}:{self.agent.__qualname__}"


def _task_mode(value: Any) -> TaskMode:
    try:
        return TaskMode(value)
    except ValueError:
        raise ConfigError(f"task_mode={value!r} is not a task mode; use 'template' or 'dataset'") from None


def _check(kwargs: dict[str, Any]) -> None:
    orchestrator = kwargs.get("orchestrator")
    if not isinstance(orchestrator, TrialQueue):
        raise _ConfigError(f"orchestrator must be a harbor TrialQueue, not {type(orchestrator).__name__}")
    depth = kwargs.get("max_queue_depth")
    if depth is not None and depth < 1:
        raise ConfigError(f"max_queue_depth must be None (unbounded) or >= 1, got {depth}")
    retries = kwargs.get("infra_retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"infra_retries must be an integer >= 0, got {retries!r}")
    starts = kwargs.get("max_concurrent_starts")
    if starts is not None and (isinstance(starts, bool) or not isinstance(starts, int) or starts < 1):
        raise ConfigError(f"max_concurrent_starts must be None (the SDK's default) or an integer >= 1, got {starts!r}")
    workers = kwargs.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64):
        raise ConfigError(f"workers must be None (OSMOSIS_HARBOR_WORKERS) or an integer from 1 to 64, got {workers!r}")
    agent = kwargs.get("agent")
    if agent is None:
        raise _ConfigError(
            "agent= is required: an AgentWorkflow class or import path, or one of " + ", ".join(NATIVE_AGENTS)
        )
    if isinstance(agent, str) and agent not in NATIVE_AGENTS and ":" not in agent and "." not in agent:
        raise ConfigError(
            f"unknown agent {agent!r}: pass an AgentWorkflow class or 'module:Class' "
            f"import path, or one of the native agents {', '.join(NATIVE_AGENTS)}"
        )


def checked_grader_inputs(paths: Sequence[str]) -> tuple[str, ...]:
    """Absolute sandbox paths the grader reads besides the agent's workdir (see ``isolate_verifier``)."""
    if isinstance(paths, str):
        raise _ConfigError(f"grader_inputs must be a list of sandbox paths, not the string {paths!r}")
    checked = []
    for path in paths:
        posix = PurePosixPath(str(path))
        if not posix.is_absolute() or ".." in posix.parts or posix == PurePosixPath("/"):
            raise ConfigError(f"grader_inputs: {path!r} must be an absolute sandbox path below / without '..'")
        checked.append(str(posix))
    return tuple(checked)


def checked_task_roots(paths: Sequence[Path]) -> tuple[Path, ...]:
    """Existing host directories (``task_roots=``) a request's local ``harbor_task`` may name."""
    if isinstance(paths, str | Path):
        raise _ConfigError(f"task_roots must be a list of directories, not the single path {str(paths)!r}")
    roots = tuple(Path(p) for p in paths)
    for root in roots:
        if not root.is_dir():
            raise ConfigError(f"task_roots: {str(root)!r} is not a directory")
    return roots


def locate_project(target: str | type) -> Path:
    """The project (directory with pyproject.toml) that contains ``target``'s module."""
    if isinstance(target, str):
        module = target.split(":", 1)[0]
        spec = importlib.util.find_spec(module)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
    else:
        source = inspect.getsourcefile(target)
        origin = Path(source) if source else None
    if origin is None:
        raise ConfigError(f"cannot locate the project of {target!r}: pass code_dir= explicitly")
    for parent in origin.resolve().parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    raise ConfigError(f"no pyproject.toml above {origin}: pass code_dir= pointing at the workflow project")
