"""Where a task's own tests run, decided once per task and carried as data (docs/threat-model.md,
"Verification modes").

Why a fresh sandbox by default: in the agent's (root, used) sandbox a workflow can plant a
program, module, library or configuration the tests' tools load (an import-path entry that did
not exist yet, a package beside a module of the same name, a shell earlier on PATH); a guard
that knows names finds each new one only after it paid. A sandbox made from the task's image
after the agent phase holds nothing the agent wrote but what the host carries into it, and the
host carries only an allow-list of data paths (``carried_paths``), never the toolchain.

The agent's sandbox (``shared``, under the verifier guard) stays for what a fresh sandbox cannot
give the tests: a service the solution leaves running (the allowance's ports), the steps of a
multi-step task (each step's tests see what the steps before left), and a task that says so.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from osmosis_harbor import settings
from osmosis_harbor.sandbox.guard import Allowance
from osmosis_harbor.tasks.verifier import agent_workdir, declared_verifier_mode, task_metadata, task_step_names
from osmosis_harbor.tasks.verifier_allowance import declared_allowance, recorded_allowance

__all__ = ["DATA_ROOTS", "Verification", "VerificationMode", "carried_paths", "decide_verification"]

# Data roots carried besides the workdir: FHS's "data served by this system", which no
# interpreter, shell or loader reads by default. Not carried, and why: /root and /home (a home
# holds the user site-packages, ~/.local/bin, shell and pip configuration: toolchain the tests'
# tools load), /tmp (scratch, and where Harbor's and our transfers stage their archives: emptying
# it before the upload would remove them), /usr, /bin,
# /sbin, /lib*, /etc, /opt, /var/lib (the toolchain and its configuration).
DATA_ROOTS = ("/srv",)

_GLOB_CHARS = frozenset("*?[")


class VerificationMode(enum.StrEnum):
    """Where the task's own tests run."""

    FRESH = "fresh"  # a new sandbox of the task's image, the agent's data carried in (Harbor's separate)
    SHARED = "shared"  # the agent's sandbox, under the verifier guard
    SEPARATE = "separate"  # the task declares Harbor's separate mode itself: its own artifacts


@dataclass(frozen=True)
class Verification:
    """One task's verification decision and its one-line reason (shown by ``validate``)."""

    mode: VerificationMode
    reason: str
    carried: tuple[str, ...] = ()  # FRESH: the paths carried into the verifier's sandbox

    def as_dict(self) -> dict[str, str]:
        return {"mode": self.mode.value, "reason": self.reason}


def decide_verification(
    task_dir: Path, *, config: settings.Settings, allowance: Allowance | None = None
) -> Verification:
    """Where ``task_dir``'s own tests run, and why (the module docstring). ``allowance``: the
    task's declared and recorded allowance (read from the task and the record when None);
    ``config``: the run's settings, read once by its owner (the backend, a validation run)."""
    declared = declared_verifier_mode(task_dir)
    if declared == "separate":
        return Verification(VerificationMode.SEPARATE, 'separate: task.toml declares environment_mode = "separate"')
    if declared == "shared":
        return Verification(VerificationMode.SHARED, 'shared: task.toml declares environment_mode = "shared"')
    steps = task_step_names(task_dir)
    if steps:
        return Verification(
            VerificationMode.SHARED,
            f"shared: a multi-step task ({len(steps)} steps) keeps one sandbox, each step's tests under the guard",
        )
    if allowance is None:
        allowance = declared_allowance(task_dir, task_metadata(task_dir)).merged(recorded_allowance(task_dir, config))
    if allowance.ports:
        ports = ", ".join(str(p) for p in sorted(allowance.ports))
        return Verification(VerificationMode.SHARED, f"shared: the solution leaves port {ports} listening")
    if not config.fresh_verifier:
        return Verification(VerificationMode.SHARED, "shared: OSMOSIS_HARBOR_FRESH_VERIFIER=0")
    carried = carried_paths(task_dir, allowance)
    if "/" in carried:
        return Verification(
            VerificationMode.SHARED, "shared: the allowance names the whole filesystem, which cannot be carried"
        )
    return Verification(VerificationMode.FRESH, "fresh: single-step, no service", carried)


def carried_paths(task_dir: Path, allowance: Allowance) -> tuple[str, ...]:
    """What a fresh verifier gets of the agent's sandbox besides ``/logs/agent`` and
    ``/logs/artifacts`` (which ``isolate_verifier`` always carries): the agent's workdir (not
    ``/``), ``DATA_ROOTS``, each declared glob's fixed directory prefix and each path the
    oracle's recorded allowance added or changed. An allow-list: nothing else of the agent's
    sandbox reaches the tests, whatever the agent wrote there."""
    found: list[str] = []
    workdir = agent_workdir(task_dir)
    if workdir and PurePosixPath(workdir) != PurePosixPath("/"):
        found.append(str(PurePosixPath(workdir)))
    found += DATA_ROOTS
    found += [glob_prefix(glob) for glob in allowance.globs]
    found += sorted(path for kind, _type, path, _digest in allowance.changes if kind != "removed")
    return tuple(dict.fromkeys(found))


def glob_prefix(glob: str) -> str:
    """The directory a path glob cannot leave: its parts before the first one with a wildcard
    (``/etc/nginx/**`` -> ``/etc/nginx``; a glob without one is its own path)."""
    parts = PurePosixPath(glob).parts
    fixed = [p for p in parts[: next((i for i, p in enumerate(parts) if _GLOB_CHARS & set(p)), len(parts))]]
    return str(PurePosixPath(*fixed)) if fixed else "/"
