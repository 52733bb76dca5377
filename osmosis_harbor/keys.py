"""The rollout API key's lifetime on the host: no retained trial directory keeps a copy.

Harbor serialises a trial's whole config (agent kwargs and env included) into the trial
directory, so trials carry only the rollout id: the workflow agent looks the endpoint and key
up here (``credentials_for``) at run time and hands them to the in-container process through
its exec environment. The key lives in host memory only; the workflow gets it through its
process environment and may still write it anywhere under ``/logs``, which Harbor copies
into the trial directory, on success, on failure and on cancellation alike. So every
trial directory that may receive the key is held in ``KeyCustody`` from before its trial
starts until it is scrubbed with the shim's ``Redactor`` rules (the key, and its
JSON-escaped and URL-encoded spellings). While held, the directory carries a marker file
(the owner process, never the key): a host process that dies before scrubbing leaves it,
and the next backend start removes every marked directory whose owner is dead
(``sweep_unscrubbed``), since the key that would be needed to scrub it is gone with the
process.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from osmosis_harbor.sandbox.owner import Owner
from osmosis_harbor.shim.errors import REDACTED, Redactor

__all__ = [
    "MARKER",
    "KeyCustody",
    "Redactor",
    "RolloutCredentials",
    "credentials_for",
    "default_trials_dirs",
    "drop_credentials",
    "hold_credentials",
    "scrub_tree",
    "sweep_unscrubbed",
]

MARKER = ".osmosis-unscrubbed"
# The backend's default work roots (tempfile.mkdtemp(prefix="osmosis-harbor-")/trials):
# a crashed process's trials live in its own root, which the next start also sweeps.
DEFAULT_TRIALS_GLOB = "osmosis-harbor-*/trials"
logger = logging.getLogger(__name__)


# ── the key in memory: per-rollout credentials ────────────────────────────────
@dataclass(frozen=True)
class RolloutCredentials:
    """The rollout's endpoint and key; ``sandbox_url`` is the endpoint as the sandbox reaches
    it when that differs (the policy relay's URL for an endpoint on the host's loopback)."""

    chat_completions_url: str
    api_key: str | None
    sandbox_url: str | None = None

    def __repr__(self) -> str:  # never print the key, even in a debugger or a log line
        return f"RolloutCredentials(chat_completions_url={self.chat_completions_url!r}, api_key=***, sandbox_url=***)"


_CREDENTIALS: dict[str, RolloutCredentials] = {}
_GUARD = threading.Lock()


def hold_credentials(rollout_id: str, credentials: RolloutCredentials) -> None:
    """Keep the rollout's endpoint and key in memory while its trial runs (the workflow agent
    reads them at run time; trials carry only the rollout id)."""
    with _GUARD:
        _CREDENTIALS[rollout_id] = credentials


def credentials_for(rollout_id: str) -> RolloutCredentials | None:
    with _GUARD:
        return _CREDENTIALS.get(rollout_id)


def drop_credentials(rollout_id: str) -> None:
    with _GUARD:
        _CREDENTIALS.pop(rollout_id, None)


# ── the key on disk: custody of trial directories ─────────────────────────────


def scrub_tree(root: Path, redactor: Redactor) -> None:
    """Replace every spelling of the key that ``redactor`` knows, in every regular file
    under ``root`` (bytes, so binary and non-UTF-8 files are covered) and in file names."""
    if not redactor.secrets or not root.exists():
        return
    needles = [(s.encode(), REDACTED.encode()) for s in redactor.secrets]
    # Deepest first, so renaming a directory never invalidates a path still to visit.
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file() and not path.is_symlink():
            _scrub_file(path, needles)
        clean = redactor.text(path.name)
        if clean != path.name:
            path.rename(path.with_name(clean))


def _scrub_file(path: Path, needles: list[tuple[bytes, bytes]]) -> None:
    try:
        data = path.read_bytes()
    except OSError:
        return
    scrubbed = data
    for needle, replacement in needles:
        scrubbed = scrubbed.replace(needle, replacement)
    if scrubbed != data:
        path.write_bytes(scrubbed)


@dataclass
class _Held:
    redactor: Redactor
    lock: threading.Lock = field(default_factory=threading.Lock)
    sealed: bool = False


class KeyCustody:
    """Trial directories that may hold a live key, each marked on disk until scrubbed.

    ``hold`` before the trial starts, ``seal`` once it has ended (however it ended), and
    ``seal_all`` at shutdown for the trials it stopped. Sealing is idempotent and
    thread-safe: a rollout's own seal and the shutdown's may race, and whichever comes
    second waits for the first.
    """

    def __init__(self) -> None:
        self._held: dict[Path, _Held] = {}
        self._guard = threading.Lock()

    def hold(self, trial_dir: Path, key: str | None) -> None:
        redactor = Redactor.for_key(key)
        if not redactor.secrets:  # no key, or a placeholder the shim does not scrub either
            return
        trial_dir.mkdir(parents=True, exist_ok=True)
        # Written before the trial starts, so a half-written marker guards no key yet.
        (trial_dir / MARKER).write_text(Owner.current().model_dump_json())
        with self._guard:
            self._held[trial_dir] = _Held(redactor)

    def seal(self, trial_dir: Path) -> None:
        """Scrub ``trial_dir`` of the key, then drop its marker (and the directory when the
        trial never wrote anything into it)."""
        with self._guard:
            held = self._held.get(trial_dir)
        if held is None:
            return
        with held.lock:
            if not held.sealed:
                scrub_tree(trial_dir, held.redactor)
                (trial_dir / MARKER).unlink(missing_ok=True)
                _remove_if_empty(trial_dir)
                held.sealed = True
        with self._guard:
            self._held.pop(trial_dir, None)

    def seal_all(self, trial_dirs: Iterable[Path]) -> None:
        for trial_dir in trial_dirs:
            self.seal(trial_dir)


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def _owner(marker: Path) -> Owner | None:
    try:
        return Owner.model_validate_json(marker.read_text())
    except (OSError, ValidationError):
        return None


def default_trials_dirs() -> list[Path]:
    """The trials directories of every backend work root in the temporary directory."""
    return sorted(Path(tempfile.gettempdir()).glob(DEFAULT_TRIALS_GLOB))


def sweep_unscrubbed(trials_dirs: Iterable[Path]) -> list[Path]:
    """Remove trial directories still marked by a process that died before scrubbing them.

    A marker whose owner is alive (another backend, in this process or another) is left
    alone; so is one from another host, whose processes cannot be judged from here. A
    marker that cannot be read was left half-made by a dead process and counts as dead.
    """
    removed: list[Path] = []
    for trials_dir in dict.fromkeys(Path(d) for d in trials_dirs):
        for marker in sorted(trials_dir.glob(f"*/{MARKER}")):
            owner = _owner(marker)
            if owner is not None and not owner.is_dead():
                continue
            shutil.rmtree(marker.parent, ignore_errors=True)
            if not marker.parent.exists():
                removed.append(marker.parent)
    for trial_dir in removed:
        logger.warning(
            "removed trial directory %s: its host process died before scrubbing the rollout's "
            "API key from it, and the key needed to scrub it died with the process",
            trial_dir,
        )
    return removed
