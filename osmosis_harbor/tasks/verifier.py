"""How a task copy is verified: its steps, the agent's workdir, a generated ``tests/test.sh``
running the Osmosis grader, and a verifier isolated from the agent's sandbox."""

from __future__ import annotations

import copy
import functools
from pathlib import Path, PurePosixPath
from typing import Any

from osmosis_harbor.shim import contract
from osmosis_harbor.task_toml import parse_task_config, task_config
from osmosis_harbor.tasks.files import write_file

__all__ = [
    "agent_users",
    "agent_workdir",
    "declared_verifier_mode",
    "separate_verifier",
    "task_artifacts",
    "generated_test_sh",
    "isolate_verifier",
    "task_metadata",
    "task_step_names",
    "verifies_in_agent_sandbox",
]

GRADING_INPUT_FILENAME = contract.GRADING_INPUT_FILENAME

AGENT_LOGS_ARTIFACT = contract.AGENT_LOGS


def task_step_names(task_dir: Path) -> list[str]:
    """The ``[[steps]]`` of a multi-step task, in order (empty for a single-step task)."""
    return [step.name for step in task_config(task_dir).steps or []]


def verifies_in_agent_sandbox(task_dir: Path) -> bool:
    """Whether any of the task's verifications runs in the agent's sandbox (Harbor's ``shared``)."""
    from harbor.models.task.verifier_mode import task_has_any_shared_verifier

    return bool(task_has_any_shared_verifier(task_config(task_dir)))


def declared_verifier_mode(task_dir: Path) -> str | None:
    """The task-level verifier mode ``task.toml`` declares (``environment_mode``, or ``separate``
    implied by a ``[verifier.environment]``), or None: Harbor's model keeps None when unset, and
    Harbor's default of ``shared`` then is no declaration of the task's."""
    verifier = task_config(task_dir).verifier
    if verifier.environment_mode is not None:
        return str(verifier.environment_mode.value)
    return "separate" if verifier.environment is not None else None


def separate_verifier(task_dir: Path) -> bool:
    """Whether the task's (single-step) verifier runs in a sandbox of its own (Harbor's ``separate``)."""
    from harbor.models.task.config import VerifierEnvironmentMode
    from harbor.models.task.verifier_mode import resolve_task_verifier_mode

    config = task_config(task_dir)
    return not config.steps and resolve_task_verifier_mode(config) == VerifierEnvironmentMode.SEPARATE


def task_artifacts(task_dir: Path) -> list[str]:
    """The plain (main-service, path) entries of the task's ``artifacts``."""
    return [a if isinstance(a, str) else a.source for a in task_config(task_dir).artifacts]


def task_metadata(task_dir: Path) -> dict[str, Any]:
    """The task's ``[metadata]`` table (a copy: the parsed config is shared)."""
    return copy.deepcopy(task_config(task_dir).metadata)


def agent_users(task_dir: Path) -> list[str | int | None]:
    """The ``[agent] user`` of each agent phase (a step's own, else the task's; None: the image's)."""
    config = task_config(task_dir)
    return [step.agent.user or config.agent.user for step in config.steps or []] or [config.agent.user]


def agent_workdir(task_dir: Path) -> str | None:
    """Where the agent works: ``[environment].workdir``, else the Dockerfile's WORKDIR."""
    from harbor.environments.definition import parse_dockerfile_workdir

    workdir: str | None = task_config(task_dir).environment.workdir
    return workdir or parse_dockerfile_workdir(Path(task_dir) / "environment" / "Dockerfile")


def isolate_verifier(task_dir: Path, grader_inputs: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Make Harbor grade this task copy in a sandbox the agent never touched.

    The workflow runs as whatever user the task gives it, often root, in the agent
    sandbox: there it can rewrite the installed grader, replace the grade script, or leave
    a process that rewrites ``/logs/verifier/reward.json`` after the grader is done. So the
    verifier runs in Harbor's ``separate`` mode: the agent sandbox is stopped, a fresh
    sandbox starts from the same image (same environment hash, so no extra build), and
    only the agent's products are copied in, as data, through Harbor's sanitising
    artifact upload: ``/logs/agent`` (its sample or trajectory), ``/logs/artifacts``, the
    agent's working directory (what a grader usually inspects; not when it is ``/``) and
    ``grader_inputs``. The grader is installed there from ``tests/`` and the reward is
    read from that sandbox alone. A task's own tests in a fresh sandbox (``tasks/verification.py``)
    take the same way, ``grader_inputs`` then being what that decision carries. Returns the paths
    carried over. The task config is
    rewritten through Harbor's own model, never by text edits."""
    path = Path(task_dir) / "task.toml"
    carried = [AGENT_LOGS_ARTIFACT]
    workdir = agent_workdir(task_dir)
    if workdir and PurePosixPath(workdir) != PurePosixPath("/"):
        carried.append(str(PurePosixPath(workdir)))
    carried += [str(PurePosixPath(p)) for p in grader_inputs]
    entries = tuple(dict.fromkeys(carried))
    write_file(path, _isolated_text(path.read_text(encoding="utf-8"), entries))
    return list(entries)


@functools.lru_cache(maxsize=256)
def _isolated_text(text: str, entries: tuple[str, ...]) -> str:
    """``text`` with the verifier in ``separate`` mode and ``entries`` among its artifacts, through
    Harbor's model (a fresh parse: this one is changed); the same for every rollout of a task."""
    from harbor.models.task.config import VerifierEnvironmentMode

    config = parse_task_config(text).model_copy(deep=True)
    config.verifier.environment_mode = VerifierEnvironmentMode.SEPARATE
    for entry in entries:
        if entry not in config.artifacts:
            config.artifacts.append(entry)
    return config.model_dump_toml()


def generated_test_sh(grade_command: str) -> str:
    return (
        "#!/bin/sh\n"
        "# Generated by osmosis-harbor: this task has no tests of its own, so the Osmosis\n"
        f"# grader is its verifier (it reads /tests/{GRADING_INPUT_FILENAME}).\n"
        "set -e\n"
        f"exec {grade_command}\n"
    )
