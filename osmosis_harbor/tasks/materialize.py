"""Per-rollout task copies: the task, plus the rollout's own files staged in it.

Host-side only. For every rollout the backend resolves a task (``TaskResolver``, see
``osmosis_harbor.tasks.refs``) and calls ``materialize_task`` to copy it into the
rollout's work directory, where the rollout's own files are staged:

* ``instruction.md``: replaced by the rendered prompt (template mode, ``prompt``);
* ``tests/osmosis_grading_input.json``: what the Osmosis grader reads in the verifier;
* ``tests/test.sh``: generated to run the grader, only when the task has no tests of
  its own (a task's own ``tests/test.sh`` always wins; ``verifier``);
* ``environment/Dockerfile``: optionally patched to pre-install the bundle's
  dependencies, and the bundle wheel itself, into the bundle venv (``dockerfile``).

A copy of a small task takes a few milliseconds (``shutil.copytree`` keeping symlinks,
after checking that none leads outside the task).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_harbor.errors import ConfigError, TaskResolutionError
from osmosis_harbor.shim.models import GradingInput
from osmosis_harbor.tasks.discovery import INSTRUCTION, is_task_dir, symlink_problem
from osmosis_harbor.tasks.dockerfile import EnvironmentPatch, patch_environment
from osmosis_harbor.tasks.files import write_file
from osmosis_harbor.tasks.refs import ResolvedTask
from osmosis_harbor.tasks.verifier import (
    GRADING_INPUT_FILENAME,
    generated_test_sh,
    isolate_verifier,
    task_step_names,
)

__all__ = ["MaterializedTask", "materialize_task", "prepare_task", "stage_rollout"]

SOLUTION = "solution"


@dataclass(frozen=True)
class MaterializedTask:
    """The materialized task directory and what was staged in it (decided once, carried as data).

    ``generated_tests``: ``tests/test.sh`` was generated from ``grade_command`` (False: the
    task's own tests run, or no grade command was given). ``environment_patched``: the
    Dockerfile installs the bundle's dependencies, so a trial installs only the wheel.
    ``bundle_baked``: the key of the bundle the Dockerfile also bakes in, so a trial
    installs nothing and only checks the image's marker (None: not baked)."""

    path: Path
    generated_tests: bool = False
    instruction_replaced: bool = False
    grading_input_written: bool = False
    environment_patched: bool = False
    verifier_isolated: bool = False
    bundle_baked: str | None = None

    def flags(self) -> dict[str, bool]:
        return {
            "generated_tests": self.generated_tests,
            "instruction_replaced": self.instruction_replaced,
            "grading_input_written": self.grading_input_written,
            "environment_patched": self.environment_patched,
            "verifier_isolated": self.verifier_isolated,
            "bundle_baked": self.bundle_baked is not None,
        }


def _relink_absolute(src_root: Path, dest: Path) -> None:
    """Point absolute symlinks (already known to stay inside the task) at the copy."""
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in [*dirnames, *filenames]:
            link = Path(dirpath) / name
            if link.is_symlink() and os.path.isabs(target := os.readlink(link)):
                inside = Path(target).resolve().relative_to(src_root)
                link.unlink()
                link.symlink_to(os.path.relpath(dest / inside, link.parent))


def materialize_task(
    source: ResolvedTask | Path,
    dest: Path,
    *,
    instruction: str | None = None,
    grading_input: GradingInput | Mapping[str, Any] | None = None,
    grade_command: str | None = None,
    environment_patch: EnvironmentPatch | None = None,
    isolate_grader: bool = False,
    grader_inputs: list[str] | tuple[str, ...] = (),
    keep_solution: bool = True,
) -> MaterializedTask:
    """Copy a task to ``dest`` (which must not exist, or be empty) and stage rollout files.

    ``keep_solution=False`` leaves the task's ``solution/`` out of the copy: only Harbor's oracle
    agent reads it, and every file in the copy is walked, filtered and hashed again by Harbor in
    each trial (its task load, trial lock and checksum), so the copy carries only what is used.

    ``isolate_grader``: when ``tests/test.sh`` is generated (the grader is the verifier),
    the grader runs in a fresh sandbox of the same image (``isolate_verifier``).

    Returns a ``MaterializedTask``: the copy's path and what was staged in it.
    Symlinks are kept as symlinks; one leading outside the task is refused, and absolute
    ones inside it are rewritten to point into the copy.

    It is ``prepare_task`` (what every rollout of the task shares) then ``stage_rollout`` (the
    rollout's own instruction and grading input); ``tasks/prepared.py`` runs the first once.
    """
    copy = prepare_task(
        source,
        dest,
        grade_command=grade_command,
        environment_patch=environment_patch,
        isolate_grader=isolate_grader,
        grader_inputs=grader_inputs,
        keep_solution=keep_solution,
    )
    return stage_rollout(copy, _label(source), instruction=instruction, grading_input=grading_input)


def _label(source: ResolvedTask | Path) -> str:
    return source.task_id if isinstance(source, ResolvedTask) else str(source)


def prepare_task(
    source: ResolvedTask | Path,
    dest: Path,
    *,
    grade_command: str | None = None,
    environment_patch: EnvironmentPatch | None = None,
    isolate_grader: bool = False,
    grader_inputs: list[str] | tuple[str, ...] = (),
    keep_solution: bool = True,
    fresh_verifier: tuple[str, ...] | None = None,
) -> MaterializedTask:
    """The copy as every rollout of the task has it (see ``materialize_task``): everything but
    the rollout's instruction and grading input. ``dest`` is removed again on failure.
    ``fresh_verifier``: the task's own tests run in a fresh sandbox of its image, these paths of
    the agent's sandbox carried in (``tasks/verification.py``, ``isolate_verifier``)."""
    src = Path(source.path if isinstance(source, ResolvedTask) else source)
    label = _label(source)
    if not is_task_dir(src):
        raise TaskResolutionError(f"task {label}: {src} has no task.toml, so it is not a Harbor task")
    if grade_command is not None and ("\n" in grade_command or "\r" in grade_command or not grade_command.strip()):
        raise ConfigError(f"grade_command must be one non-empty shell command line, got {grade_command!r}")
    problem = symlink_problem(src)
    if problem is not None:
        raise TaskResolutionError(f"task {label}: {problem}")
    dest = Path(dest)
    if dest.resolve().is_relative_to(src.resolve()):
        raise ConfigError(f"materialize_task: destination {dest} is inside the task {src}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"materialize_task: {dest} already exists and is not an empty directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged: dict[str, Any] = {}
    try:
        top = os.path.abspath(src)
        left_out = [] if keep_solution else [SOLUTION]
        shutil.copytree(
            src,
            dest,
            symlinks=True,
            dirs_exist_ok=dest.exists(),
            ignore=lambda directory, _names: left_out if os.path.abspath(directory) == top else [],
        )
        _relink_absolute(src.resolve(), dest)
        tests = dest / "tests"
        if grade_command is not None and not any(
            (tests / name).exists() or (tests / name).is_symlink() for name in ("test.sh", "test.bat")
        ):
            write_file(tests / "test.sh", generated_test_sh(grade_command), mode=0o755)
            staged["generated_tests"] = True
            if isolate_grader:
                isolate_verifier(dest, grader_inputs)
                staged["verifier_isolated"] = True
        elif fresh_verifier is not None:
            isolate_verifier(dest, fresh_verifier)
            staged["verifier_isolated"] = True
        if environment_patch is not None:
            staged["environment_patched"] = patch_environment(dest / "environment", environment_patch)
            if staged["environment_patched"]:
                staged["bundle_baked"] = environment_patch.bundle_key
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return MaterializedTask(path=dest, **staged)


def stage_rollout(
    copy: MaterializedTask,
    label: str,
    *,
    instruction: str | None = None,
    grading_input: GradingInput | Mapping[str, Any] | None = None,
) -> MaterializedTask:
    """The rollout's own files in its copy: ``instruction.md`` (the rendered prompt) and the
    grader's input (``shim.models.GradingInput``; a mapping is validated as one first). Written by replacing the name (``write_file``): the copy's files may be
    links to a prepared template. The copy is removed again on failure."""
    dest = copy.path
    staged: dict[str, Any] = {}
    try:
        if instruction is not None:
            write_file(dest / INSTRUCTION, instruction)
            staged["instruction_replaced"] = True
        elif not (dest / INSTRUCTION).is_file() and not task_step_names(dest):  # steps carry their own
            raise TaskResolutionError(f"task {label}: no {INSTRUCTION} and no instruction was given")
        if grading_input is not None:
            model = (
                grading_input if isinstance(grading_input, GradingInput) else GradingInput.model_validate(grading_input)
            )
            write_file(dest / "tests" / GRADING_INPUT_FILENAME, model.model_dump_json(fallback=str))
            staged["grading_input_written"] = True
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dataclasses.replace(copy, **staged)
