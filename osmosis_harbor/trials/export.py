"""A rollout's files where the Osmosis platform looks: ``<artifact root>/<rollout id>/``.

``LocalBackend`` gives a workflow ``<root>/<id>/artifacts/`` as its ``ctx.artifacts_dir``, and
osmosis-ai's harness and platform collect that tree (and ``trajectory.json`` beside it, which the
osmosis server writes). In a sandbox the workflow writes ``/logs/artifacts``, which Harbor brings
to the trial directory as ``artifacts/logs/artifacts/`` (per step: ``steps/<name>/artifacts/...``)
and deletes with it. So before the trial directory is cleaned, its artifacts are copied to
``<root>/<id>/artifacts/`` (the steps' in step order, later files winning), and Harbor's trial logs
to ``<root>/<id>/logs/`` as osmosis-ai's own Harbor backend retains them (``trial.log``,
``exception.txt``, ``agent/``, ``verifier/``, and ``steps/<name>/agent|verifier``).

The root is osmosis-ai's: ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``, else ``~/.osmosis``, read per export
as its server reads it per save. What is copied was written by a sandbox: it is read from the
sealed (already scrubbed of the key, ``key_custody.py``) trial directory beneath directory fds, never
following a link (links and special files are left out, and named in the log), and written
beneath the root's fds (``sandbox.extract.beneath``), within ``OSMOSIS_HARBOR_EXPORT_MAX_BYTES`` /
``_FILES``. The export is best-effort: nothing it meets changes the rollout's reward or status.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_ai.rollout.utils.file_artifacts import default_artifact_root
from osmosis_ai.rollout.utils.identifiers import is_single_path_segment

from osmosis_harbor import settings
from osmosis_harbor.sandbox.transfer.extract.beneath import Beneath, Conflict, Parts
from osmosis_harbor.shim import contract

__all__ = ["ARTIFACTS", "LOGS", "ExportReport", "export_rollout_files"]

log = logging.getLogger(__name__)

ARTIFACTS = "artifacts"  # <root>/<id>/artifacts: ctx.artifacts_dir's files, as LocalBackend keeps them
LOGS = "logs"  # <root>/<id>/logs: Harbor's trial logs, as osmosis-ai's Harbor backend retains them
TRIAL_LOG_ENTRIES = ("trial.log", "exception.txt", "agent", "verifier")
STEP_LOG_ENTRIES = ("agent", "verifier")
# Where Harbor puts the collected /logs/artifacts inside an artifacts directory.
CONVENTION = tuple(contract.ARTIFACTS_LOGS.strip("/").split("/"))
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class ExportReport:
    """What one export copied and left out (names relative to the trial directory)."""

    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # links, special files, unreadable entries
    over_limit: list[str] = field(default_factory=list)


def export_rollout_files(
    trial_dir: Path, rollout_id: str, steps: Sequence[str] = (), *, config: settings.Settings
) -> ExportReport | None:
    """Copy the trial's artifacts and logs to ``<root>/<rollout_id>/``, within ``config``'s
    export bounds (the backend's settings); None when there was nothing to do (no trial
    directory) or the id cannot name a directory. Never raises."""
    report = ExportReport()
    try:
        if not is_single_path_segment(rollout_id) or not trial_dir.is_dir():
            return None
        root = default_artifact_root()
        budget = _Budget(config.export_max_files, config.export_max_bytes)
        with _Source(trial_dir) as source, Beneath(root) as target:
            for parts, into in _plan(source, steps):
                _copy_tree(source, parts, target, (rollout_id, *into), budget, report)
    except OSError as exc:
        log.warning("could not export rollout %s's files: %s", rollout_id, exc.strerror or exc)
    if report.skipped or report.over_limit:
        log.warning(
            "rollout %s's files were exported without %d link(s) or special file(s) (%s) and %d file(s) over "
            "OSMOSIS_HARBOR_EXPORT_MAX_FILES/_BYTES (%s)",
            rollout_id,
            len(report.skipped),
            ", ".join(report.skipped[:5]),
            len(report.over_limit),
            ", ".join(report.over_limit[:5]),
        )
    return report


def _plan(source: _Source, steps: Sequence[str]) -> Iterator[tuple[Parts, Parts]]:
    """(tree in the trial directory, where it goes under ``<id>/``), in copy order."""
    for step in steps:
        yield ("steps", step, "artifacts", *CONVENTION), (ARTIFACTS,)
    yield ("artifacts", *CONVENTION), (ARTIFACTS,)
    for name in TRIAL_LOG_ENTRIES:
        yield (name,), (LOGS, name)
    for step in steps:
        for name in STEP_LOG_ENTRIES:
            yield ("steps", step, name), (LOGS, "steps", step, name)


@dataclass
class _Budget:
    files: int
    bytes: int

    def take(self, size: int) -> bool:
        if self.files < 1 or size > self.bytes:
            return False
        self.files -= 1
        self.bytes -= size
        return True


class _Source:
    """The trial directory, read beneath its fd without following any link."""

    def __init__(self, root: Path) -> None:
        self._fd = os.open(root, _DIR)

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def open(self, parts: Parts) -> tuple[int, os.stat_result] | None:
        """An fd of the entry at ``parts`` and its stat (a directory or a regular file), else None
        (absent, a link anywhere on the way, a special file)."""
        fd = os.dup(self._fd)
        try:
            for index, name in enumerate(parts):
                child = os.open(name, _FILE if index == len(parts) - 1 else _DIR, dir_fd=fd)
                os.close(fd)
                fd = child
            info = os.fstat(fd)
        except OSError:
            os.close(fd)
            return None
        if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
            return fd, info
        os.close(fd)
        return None


def _copy_tree(
    source: _Source, parts: Parts, target: Beneath, into: Parts, budget: _Budget, report: ExportReport
) -> None:
    opened = source.open(parts)
    if opened is None:
        return
    fd, info = opened
    try:
        if stat.S_ISREG(info.st_mode):
            _copy_file(fd, info, parts, target, into, budget, report)
            return
        target.directory(into)
        for entry in sorted(os.scandir(fd), key=lambda e: e.name):
            if entry.is_symlink() or not (entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)):
                report.skipped.append("/".join((*parts, entry.name)))
                continue
            _copy_tree(source, (*parts, entry.name), target, (*into, entry.name), budget, report)
    finally:
        os.close(fd)


def _copy_file(
    fd: int, info: os.stat_result, parts: Parts, target: Beneath, into: Parts, budget: _Budget, report: ExportReport
) -> None:
    name = "/".join(parts)
    if not budget.take(info.st_size):
        report.over_limit.append(name)
        return
    try:
        with os.fdopen(os.dup(fd), "rb") as stream:
            target.write_file(into, stream, info.st_size, info.st_mode, info.st_mtime)
    except (OSError, EOFError, Conflict) as exc:  # changed under us, or a directory in the way
        report.skipped.append(f"{name} ({exc})")
        return
    report.files += 1
    report.bytes += info.st_size
