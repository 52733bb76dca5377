"""What a separate verifier gets of the agent's sandbox, settled on the host between Harbor's
download of the agent's outputs and their upload (at ``VERIFICATION_START``).

The workdir, without the names that would load the agent's code into the verifier's own tools
before any test asked for it. Tests often run ``python -m pytest`` (or ``python -c``) from the
workdir, which puts it first on the import path. There a module named after one of the standard
library's (``json.py``, an ``enum/`` package) or of the test runner's (``pytest.py``,
``_pytest/``, ``pluggy/``) replaces the verifier's own; a ``conftest.py`` or ``pytest.ini``
configures the runner; ``sitecustomize.py``/``usercustomize.py`` and ``*.pth`` are start-up hooks
wherever they land on a site directory. So, at the workdir's top, every entry that would be
importable under such a name (a ``.py``/``.pyc``/extension module, a directory with an
``__init__``, a link) and the runner's configuration files are dropped from the host's copy, and
the log names each. The rule is the interpreter's and the runner's own names, not a list of
tricks: everything else is carried as data, and a test that imports the agent's code runs that
code by the task's design.

Every carried directory as the agent left it, absence included. Harbor empties a carried
directory in the verifier's sandbox before uploading the agent's copy, so a file deleted there is
gone for the tests; but a directory with no copy on the host (the agent removed it, or its
download failed) is skipped, leaving the image's. So a carried directory without a host copy
gets an empty one: the tests see it emptied, never the image's content in its place.
"""

from __future__ import annotations

import fnmatch
import logging
import shutil
import sys
from pathlib import Path

from harbor.models.task.config import ArtifactConfig
from harbor.trial.artifact_handler import artifact_host_path
from harbor.trial.hooks import TrialEvent, TrialHookEvent
from harbor.trial.queue import TrialQueue

from osmosis_harbor.tasks.verification import DATA_ROOTS, glob_prefix
from osmosis_harbor.tasks.verifier import agent_workdir, separate_verifier, task_artifacts, task_metadata
from osmosis_harbor.tasks.verifier_allowance import declared_allowance

__all__ = ["DROPPED", "add_carried_hooks", "carried_directories", "drop_loaded_names"]

log = logging.getLogger(__name__)

# The test runner's modules (pytest and what it imports at start-up) and the interpreter's hooks.
_RUNNER = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "sitecustomize", "usercustomize"})
DROPPED = ("*.pth", "conftest.py", "pytest.ini", ".pytest.ini")  # besides importable names (``_importable``)
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")


def _owned(module: str) -> bool:
    return module in _RUNNER or module in sys.stdlib_module_names


def _importable(path: Path) -> str | None:
    """The module name ``path`` would be imported as from its directory, or None."""
    name = path.name
    if path.is_symlink():  # whatever it leads to (a package, a module): judged by its name alone
        return name.split(".", 1)[0]
    if path.is_dir():
        has_init = any(p.name.split(".", 1)[0] == "__init__" for p in path.iterdir())
        return name if has_init and name.isidentifier() else None
    if name.endswith(_MODULE_SUFFIXES):
        return name.split(".", 1)[0]  # json.py, _json.cpython-312-x86_64-linux-gnu.so
    return None


def drop_loaded_names(copy: Path) -> list[str]:
    """Remove, at the top of ``copy`` (the host's copy of a workdir), what the verifier's own
    interpreter or test runner would load from there (the module docstring); returns the names
    removed. Links are removed as links, never followed."""
    dropped = []
    try:
        entries = sorted(copy.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    for path in entries:
        module = _importable(path)
        if not (any(fnmatch.fnmatchcase(path.name, p) for p in DROPPED) or (module is not None and _owned(module))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        dropped.append(path.name)
    return dropped


def carried_directories(task_dir: Path) -> list[str]:
    """The directories among the artifacts a separate verifier of ``task_dir`` gets: its workdir,
    ``DATA_ROOTS`` and the fixed prefixes of its declared globs that have a wildcard (a glob
    without one, like a recorded allowance's path, may name a file)."""
    workdir = agent_workdir(task_dir)
    globs = declared_allowance(task_dir, task_metadata(task_dir)).globs
    candidates = [workdir, *DATA_ROOTS, *(prefix for g in globs if (prefix := glob_prefix(g)) != g)]
    artifacts = set(task_artifacts(task_dir))
    return [d for d in dict.fromkeys(candidates) if d and d.rstrip("/") and d in artifacts]


def add_carried_hooks(queue: TrialQueue) -> None:
    """On each trial's ``VERIFICATION_START`` (the agent's outputs are downloaded, nothing is
    uploaded yet): a separate verifier's workdir copy loses ``drop_loaded_names``, and a carried
    directory without a host copy gets an empty one (the module docstring)."""

    async def hook(event: TrialHookEvent) -> None:
        task = event.config.task.path
        if task is None or not separate_verifier(Path(task)):
            return
        workdir = agent_workdir(Path(task))
        artifacts = Path(event.config.trials_dir) / event.config.trial_name / "artifacts"
        for directory in carried_directories(Path(task)):
            copy = artifact_host_path(artifacts, ArtifactConfig(source=directory))
            if not copy.exists() and not copy.is_symlink():
                copy.mkdir(parents=True)
            dropped = drop_loaded_names(copy) if directory == workdir else []
            if dropped:
                log.warning(
                    "trial %s: not carried into the verifier's workdir %s (its tools would load them): %s",
                    event.config.trial_name,
                    directory,
                    ", ".join(dropped),
                )

    queue.add_hook(TrialEvent.VERIFICATION_START, hook)
