"""The agent's workdir as a separate verifier gets it: without the names that would load the
agent's code into the verifier's own tools before any test asked for it.

Why: tests often run ``python -m pytest`` (or ``python -c``) from the workdir, which puts it
first on the import path. There a module named after one of the standard library's (``json.py``,
an ``enum/`` package) or of the test runner's (``pytest.py``, ``_pytest/``, ``pluggy/``)
replaces the verifier's own; a ``conftest.py`` or ``pytest.ini`` configures the runner;
``sitecustomize.py``/``usercustomize.py`` and ``*.pth`` are start-up hooks wherever they land
on a site directory. So, at the workdir's top, every entry that would be importable under such a
name (a ``.py``/``.pyc``/extension module, or a directory with an ``__init__``) and the runner's
configuration files are dropped from the host's copy before Harbor uploads it (after the
download, at ``VERIFICATION_START``), and the log names each. The rule is the interpreter's and
the runner's own names, not a list of tricks: everything else is carried as data, and a test
that imports the agent's code runs that code by the task's design.
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

from osmosis_harbor.tasks.verifier import agent_workdir, separate_verifier

__all__ = ["DROPPED", "add_carried_workdir_hooks", "drop_loaded_names"]

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


def add_carried_workdir_hooks(queue: TrialQueue) -> None:
    """On each trial's ``VERIFICATION_START`` (the agent's outputs are downloaded, nothing is
    uploaded yet), drop ``DROPPED`` names from the copy of the workdir a separate verifier gets."""

    async def hook(event: TrialHookEvent) -> None:
        task = event.config.task.path
        if task is None or not separate_verifier(Path(task)):
            return
        workdir = agent_workdir(Path(task))
        if not workdir or workdir.rstrip("/") == "":
            return
        artifacts = Path(event.config.trials_dir) / event.config.trial_name / "artifacts"
        dropped = drop_loaded_names(artifact_host_path(artifacts, ArtifactConfig(source=workdir)))
        if dropped:
            log.warning(
                "trial %s: not carried into the verifier's workdir %s (the verifier's tools would load them): %s",
                event.config.trial_name,
                workdir,
                ", ".join(dropped),
            )

    queue.add_hook(TrialEvent.VERIFICATION_START, hook)
