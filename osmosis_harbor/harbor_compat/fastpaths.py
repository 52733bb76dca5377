"""Harbor's per-trial task checks, computed with fewer path objects: the same answers, faster.

Why: every Harbor trial loads its task again (``Task.__init__``), hashes it for the trial lock
(``Packager.compute_content_hash``), computes ``Task.checksum`` and re-checks it for a separate
verifier. All of these walk the task through ``TaskFileFilter.is_excluded`` and
``validate_input_tree``, written with ``pathlib`` (``relative_to``, ``resolve``,
``is_relative_to``), which on Python 3.12 build dozens of path objects per call. For a 9-file
task copy that is about 45 ms of host CPU per trial, most of the host CPU a graded rollout costs.
Harbor 0.25 offers no way to hand a trial an already checked task.

What this does: it installs string-based versions of those five functions in Harbor's classes
and modules. Each one computes exactly what Harbor's does, in the same order, raising the same
errors with the same messages; ``tests/unit/harbor_compat/test_fastpaths.py`` checks that against Harbor's
originals on generated task trees (``.harborignore`` rules, links inside and out, loops). Each
is installed only when the Harbor function it replaces has the source it was verified against
(a different Harbor keeps its own code; ``installed()`` says what was replaced), and
``OSMOSIS_HARBOR_HARBOR_FASTPATHS=0`` turns them all off.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_harbor import settings
from osmosis_harbor.harbor_compat import string_paths

log = logging.getLogger(__name__)


# ── harbor.utils.path_safety.validate_input_tree ──────────────────────────────────────────────
def validate_input_tree(path: Path, root: Path, *, exclude: Callable[[Path], bool] | None = None) -> None:
    """Harbor's ``validate_input_tree``: every input, link targets included, stays in ``root``.

    The one shortcut: an entry that is not a link, inside a directory already resolved, resolves
    to that directory's resolved path plus its name, so only links (and the top) are resolved."""
    root_s = string_paths.resolve(os.fspath(root))
    checked: set[str] = set()

    def visit(candidate: str, resolved: str | None, ancestors: frozenset[str]) -> None:
        if exclude is not None and exclude(Path(candidate)):
            return
        if resolved is None:
            resolved = string_paths.resolve(candidate)
        if not string_paths.within(resolved, root_s):
            raise ValueError(f"Input paths must stay within the task: {candidate}")
        if not string_paths.is_dir(candidate):
            return
        if resolved in ancestors:
            raise ValueError(f"Input directory links must not form cycles: {candidate}")
        if exclude is None and resolved in checked:
            return
        inner = ancestors | {resolved}
        with os.scandir(candidate) as entries:
            children = [(entry.name, entry.is_symlink()) for entry in entries]
        for name, is_link in children:
            visit(string_paths.child(candidate, name), None if is_link else string_paths.child(resolved, name), inner)
        checked.add(resolved)

    visit(str(Path(path)), None, frozenset())


# ── harbor.utils.file_selection.select_files ──────────────────────────────────────────────────
def select_files(source_dir: Path | str, *, exclude: Callable[[Path], bool] | None = None) -> Any:
    """Harbor's ``select_files``: entries under ``source_dir`` (sorted per directory, links not
    followed) that ``exclude`` keeps, as Harbor's ``FileSelection``."""
    from harbor.utils.file_selection import FileSelection

    source = os.path.abspath(source_dir)
    if not string_paths.is_dir(source):
        raise FileNotFoundError(f"Source directory {Path(source)} does not exist")
    if exclude is not None and exclude(Path(source)):
        return FileSelection(Path(source), ())
    retained: list[Path] = []
    includes_all_entries = True

    def visit(directory: str) -> None:
        nonlocal includes_all_entries
        for name in sorted(os.listdir(directory)):
            path = string_paths.child(directory, name)
            if exclude is not None and exclude(Path(path)):
                includes_all_entries = False
                continue
            retained.append(Path(string_paths.relative(path, source)))
            if string_paths.is_dir(path) and not os.path.islink(path):
                visit(path)

    visit(source)
    return FileSelection(Path(source), tuple(retained), includes_all_entries=includes_all_entries)


# ── harbor.models.task.file_filter.TaskFileFilter ─────────────────────────────────────────────
@functools.lru_cache(maxsize=8192)
def _in_scope(text: str) -> bool:
    """``TaskFileFilter._IGNORE_SCOPES.match_file(text)``: a constant spec, so its answer per text is too."""
    from harbor.models.task.file_filter import TaskFileFilter

    return bool(TaskFileFilter._IGNORE_SCOPES.match_file(text))


def _matches(self: Any, path: Path) -> bool:
    """``TaskFileFilter._matches``: is ``path`` (normalized, within the task) ignored by a
    ``.harborignore`` of a directory in scope (``tests/``, ``solution/``, their step forms)."""
    root = str(self.task_dir)
    target = str(path)
    relative = string_paths.relative(target, root)
    parts = [] if relative == "." else relative.split("/")
    if (parts[-1] if parts else "") == self.IGNORE_FILENAME:
        return True
    target_is_dir = string_paths.is_dir(target)
    if not _in_scope(relative + ("/" if target_is_dir else "")):
        return False
    specs: list[tuple[str, Any]] = []
    candidate = root
    for index, part in enumerate(parts):
        if _in_scope(string_paths.relative(candidate, root) + "/"):
            specs.append((candidate, self._spec_for(Path(candidate))))
        candidate = string_paths.child(candidate, part)
        suffix = "/" if index < len(parts) - 1 or target_is_dir else ""
        if not _in_scope(string_paths.relative(candidate, root) + suffix):
            continue
        excluded = False
        for directory, spec in specs:
            if not spec.patterns:
                continue  # an empty spec never decides (check_file's include stays None)
            match = spec.check_file(string_paths.relative(candidate, directory) + suffix)
            if match.include is not None:
                excluded = match.include
        if excluded:
            return True
    return False


def is_excluded(self: Any, path: Path | str) -> bool:
    """``TaskFileFilter.is_excluded``: the path, or the task-internal target of a link to it, is ignored."""
    absolute = os.path.abspath(path)
    root = str(self.task_dir)
    if not string_paths.within(absolute, root):
        return False
    if self._matches(Path(absolute)):
        return True
    resolved = string_paths.resolve_below(absolute, root)
    return resolved != absolute and string_paths.within(resolved, root) and bool(self._matches(Path(resolved)))


# ── harbor.publisher.packager.Packager.collect_files ──────────────────────────────────────────
@functools.lru_cache(maxsize=64)
def _gitignore_spec(lines: tuple[str, ...]) -> Any:
    """A compiled ``gitignore`` spec per set of lines (matching does not change it)."""
    import pathspec

    return pathspec.PathSpec.from_lines("gitignore", list(lines))


def collect_files(task_dir: Path) -> list[Path]:
    """``Packager.collect_files``: the task's publishable files (what the trial lock hashes),
    filtered by its ``.gitignore`` (or Harbor's default ignores) and sorted by relative path."""
    from harbor.models.task.paths import TaskPaths
    from harbor.publisher import packager

    task_dir = task_dir.resolve()
    paths = TaskPaths(task_dir)
    file_filter = packager.TaskFileFilter(task_dir)
    files = [
        single
        for single in (paths.config_path, paths.instruction_path, paths.readme_path, paths.trajectory_path)
        if single.exists()
    ]
    for directory in (paths.environment_dir, paths.tests_dir, paths.solution_dir, paths.steps_dir):
        if directory.exists():
            selection = packager.select_files(directory, exclude=file_filter.is_excluded)
            for relative_path in selection.relative_paths:
                candidate = directory / relative_path
                if candidate.is_file():
                    files.append(candidate)
    if paths.gitignore_path.exists():
        spec = _gitignore_spec(tuple(paths.gitignore_path.read_text().splitlines()))
    else:
        spec = _gitignore_spec(tuple(packager.DEFAULT_IGNORES))
    root = str(task_dir)
    relative = [(string_paths.relative(str(f), root), f) for f in files]
    kept = [(rel, f) for rel, f in relative if not spec.match_file(rel)]
    kept.sort(key=lambda pair: pair[0])
    return [f for _, f in kept]


# ── installing ────────────────────────────────────────────────────────────────────────────────
@dataclass(frozen=True)
class FastPath:
    """One Harbor attribute replaced: where it lives, the digest of the source it was verified
    against, and what replaces it."""

    module: str
    owner: str | None  # a class in ``module``, or None for a module global
    name: str
    source_sha256: str
    replacement: Any

    @property
    def label(self) -> str:
        return f"{self.module}:{self.owner + '.' if self.owner else ''}{self.name}"


# The sha256 of each original's ``inspect.getsource`` in Harbor 0.25.0, the source the differential
# tests compare against. ``validate_input_tree`` and ``select_files`` are module globals of each
# module that imports them by name (``TaskPaths.validate_input_tree`` calls the one in ``paths``).
_VALIDATE = "2536a39f61d6f200cd57cf0799b132878d2a5f4e4e5549440306bcc74c85ed4a"
_SELECT = "205aaa64e806f6602b8a943ccf93832a5641e7515c2f892c0e30b0289e84bae0"
_FILTER = "harbor.models.task.file_filter"
FASTPATHS: tuple[FastPath, ...] = (
    FastPath(
        _FILTER,
        "TaskFileFilter",
        "_matches",
        "c623cdc53f125ed25093a187254f6fed3e55d5eda1d688833b0a804b97c09cba",
        _matches,
    ),
    FastPath(
        _FILTER,
        "TaskFileFilter",
        "is_excluded",
        "f9e9f4fb7b304c48f26b2252f5ceedd0663ae9c1665dbbd7bbe1143fc0df04d4",
        is_excluded,
    ),
    FastPath("harbor.models.task.paths", None, "validate_input_tree", _VALIDATE, validate_input_tree),
    FastPath(_FILTER, None, "validate_input_tree", _VALIDATE, validate_input_tree),
    FastPath(_FILTER, None, "select_files", _SELECT, select_files),
    FastPath("harbor.publisher.packager", None, "select_files", _SELECT, select_files),
    FastPath(
        "harbor.publisher.packager",
        "Packager",
        "collect_files",
        "e3ee34c22bd0630fdc30b7ae6b4eaee7d32983a2b9d372eb3c274199a641b5b4",
        collect_files,
    ),
)

_lock = threading.Lock()
_installed: dict[str, Any] = {}  # label -> the original


def source_sha256(obj: Any) -> str:
    """The digest a fast path is keyed on: the original's source text."""
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def _holder(fast: FastPath) -> Any:
    import importlib

    module = importlib.import_module(fast.module)
    return getattr(module, fast.owner) if fast.owner else module


def original(label: str) -> Any:
    """Harbor's own function behind ``label``, installed or not (for the differential tests)."""
    if label in _installed:
        return _installed[label]
    fast = next(f for f in FASTPATHS if f.label == label)
    return getattr(_holder(fast), fast.name)


def install(config: settings.Settings) -> tuple[str, ...]:
    """Replace each Harbor function whose source is the verified one; idempotent, thread-safe.
    Returns the labels now replaced. A no-op when ``OSMOSIS_HARBOR_HARBOR_FASTPATHS`` is off
    in ``config`` (the caller's settings: the backend's options, the validation run's)."""
    if not config.harbor_fastpaths:
        return installed()
    with _lock:
        for fast in FASTPATHS:
            if fast.label in _installed:
                continue
            holder = _holder(fast)
            current = holder.__dict__[fast.name] if fast.owner else getattr(holder, fast.name)
            function = current.__func__ if isinstance(current, staticmethod) else current
            if source_sha256(function) != fast.source_sha256:
                log.debug("Harbor's %s is not the verified version: kept", fast.label)
                continue
            _installed[fast.label] = current
            setattr(holder, fast.name, staticmethod(fast.replacement) if function is not current else fast.replacement)
    return installed()


def uninstall(labels: tuple[str, ...] | None = None) -> None:
    """Put Harbor's originals back: all, or those of ``labels`` (tests, and the bench's
    with-and-without runs of one group)."""
    with _lock:
        for fast in FASTPATHS:
            if fast.label in _installed and (labels is None or fast.label in labels):
                setattr(_holder(fast), fast.name, _installed.pop(fast.label))


def installed() -> tuple[str, ...]:
    """Labels of the Harbor functions currently replaced."""
    return tuple(label for label in (f.label for f in FASTPATHS) if label in _installed)
