"""What a failed row needs beyond its verdict before anyone reads it: the offline stand-in that
may be its real cause, and host secrets out of every error.

A task built ``FROM python:3.13-slim-bookworm`` on a machine without registry access runs on a
Debian trixie stand-in (``sandbox.stand_ins``); a verifier checking ``/etc/os-release`` or
OpenSSL's output format then fails although the solution is right. A solution or verifier
failure of such a task carries ``stand_in``, the sentence naming the stand-in and what it
really is, which the table, the JSON and the JUnit report show. Failures in other phases do
not: a missing base image or a refused task is not the stand-in's doing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from osmosis_harbor.sandbox.images.base_images import base_images
from osmosis_harbor.sandbox.images.stand_ins import LabelsOf, stand_in_note
from osmosis_harbor.task_toml import task_config
from osmosis_harbor.tasks.discovery import TaskRef
from osmosis_harbor.trials.evidence import host_secrets, redacted
from osmosis_harbor.trials.reading import TrialPhase
from osmosis_harbor.validate.report import TaskValidation

__all__ = ["STAND_IN_PHASES", "note_causes", "task_base_images"]

STAND_IN_PHASES = frozenset({TrialPhase.AGENT.value, TrialPhase.VERIFIER.value})


def task_base_images(task_dir: Path, *, force_build: bool) -> list[str]:
    """The images a task's sandbox starts from: its prebuilt ``docker_image`` when that is what
    runs, else its Dockerfile's ``FROM`` images."""
    dockerfile = task_dir / "environment" / "Dockerfile"
    try:
        docker_image = task_config(task_dir).environment.docker_image
    except (OSError, ValueError):  # an unreadable task.toml failed its row already
        docker_image = None
    if docker_image and not (force_build and dockerfile.is_file()):
        return [docker_image]
    try:
        return base_images(dockerfile.read_text(errors="replace"))
    except OSError:
        return []


def _redact_row(row: TaskValidation, secrets: Sequence[str]) -> None:
    if row.error:
        row.error = redacted(row.error, secrets)
    for step in row.steps or []:
        if step.error:
            step.error = redacted(step.error, secrets)


def note_causes(
    rows: Iterable[TaskValidation], tasks: Sequence[TaskRef], *, force_build: bool, labels_of: LabelsOf
) -> None:
    """Redact every row's errors and note the stand-ins of solution and verifier failures, in
    place (``labels_of``: the local engine's labels of an image)."""
    paths = {task.id: task.path for task in tasks}
    secrets = host_secrets()
    cache: dict[str, Mapping[str, str] | None] = {}

    def cached_labels(image: str) -> Mapping[str, str] | None:
        if image not in cache:
            cache[image] = labels_of(image)
        return cache[image]

    for row in rows:
        _redact_row(row, secrets)
        if row.passed or row.failed_phase not in STAND_IN_PHASES or row.id not in paths:
            continue
        row.stand_in = stand_in_note(task_base_images(paths[row.id], force_build=force_build), cached_labels)
