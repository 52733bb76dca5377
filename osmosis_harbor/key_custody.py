"""The rollout API key's lifetime on the host: no retained trial directory keeps a copy.

Harbor serialises a trial's whole config (agent kwargs and env included) into the trial
directory, so trials carry only the rollout id: the workflow agent looks the endpoint and key
up in its owner's ``CredentialStore`` (``credentials.py``) at run time and hands them to the
in-container process through its exec environment. The key lives in host memory only; the workflow gets it through its
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
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.shim.errors import REDACTED, Redactor

__all__ = [
    "MARKER",
    "KeyCustody",
    "ScrubReport",
    "default_trials_dirs",
    "scrub_tree",
    "sweep_unscrubbed",
]

MARKER = ".osmosis-unscrubbed"
# The backend's default work roots (tempfile.mkdtemp(prefix="osmosis-harbor-")/trials):
# a crashed process's trials live in its own root, which the next start also sweeps.
DEFAULT_TRIALS_GLOB = "osmosis-harbor-*/trials"
SCRUB_CHUNK = 1 << 20  # a scrub reads files in chunks of this size (plus the longest key spelling)
logger = logging.getLogger(__name__)


# ── the key on disk: custody of trial directories ─────────────────────────────


@dataclass
class ScrubReport:
    """What a scrub changed and what it could not do, in words that never hold the key."""

    files: int = 0  # files whose content held the key
    renamed: int = 0  # entries whose name held the key
    links: list[str] = field(default_factory=list)  # links whose target held it, now plain files
    failures: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.failures


def scrub_tree(root: Path, redactor: Redactor) -> ScrubReport:
    """Replace every spelling of the key that ``redactor`` knows in every regular file under
    ``root`` (as bytes, streamed: binary and non-UTF-8 files are covered, memory stays
    bounded), in link targets and in names. Nothing is followed: a link whose target holds
    the key becomes a plain file saying so; a scrubbed name that is taken gets a unique one.
    Never raises: what could not be done is in the report's ``failures`` (redacted)."""
    report = ScrubReport()
    if not redactor.secrets or not root.exists():
        return report
    scrubber = _Scrubber(redactor, report)

    def failed(exc: OSError) -> None:
        report.failures.append(redactor.text(f"cannot list {exc.filename}: {exc.strerror}"))

    # Bottom-up, so renaming a directory never invalidates a path still to visit.
    for directory, dirs, files in os.walk(root, topdown=False, onerror=failed):
        for name in files:
            scrubber.entry(Path(directory), name)
        for name in dirs:  # os.walk lists links to directories here too (never entered)
            if os.path.islink(Path(directory) / name):
                scrubber.entry(Path(directory), name)
            else:
                scrubber.rename_if_named(Path(directory), name)
    return report


class _Scrubber:
    """One scrub's needles and report."""

    def __init__(self, redactor: Redactor, report: ScrubReport) -> None:
        self.redactor = redactor
        self.report = report
        self.pattern = re.compile(b"|".join(re.escape(s.encode()) for s in redactor.secrets))
        self.overlap = max(len(s.encode()) for s in redactor.secrets) - 1

    def entry(self, directory: Path, name: str) -> None:
        path = directory / name
        try:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                self._link(path)
            elif stat.S_ISREG(info.st_mode) and self._holds_key(path):
                self._rewrite(path, info)
                self.report.files += 1
        except OSError as exc:
            self.report.failures.append(self.redactor.text(f"{path}: {exc.strerror or exc}"))
            return
        self.rename_if_named(directory, name)

    def _link(self, path: Path) -> None:
        target = os.readlink(path)
        clean = self.redactor.text(target)
        if clean == target:
            return
        path.unlink()
        note = f"osmosis-harbor: a symbolic link to {clean} was here; its target held the rollout's API key\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(note)
        self.report.links.append(self.redactor.text(str(path)))

    def _open(self, path: Path) -> int:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(path, flags)
        except PermissionError:  # the sandbox made it unreadable: it is ours on the host
            os.chmod(path, 0o600, follow_symlinks=False)
            return os.open(path, flags)

    def _chunks(self, path: Path) -> Iterator[tuple[bytes, bool]]:
        """The file's bytes in bounded chunks, each with the tail of the one before (so a key
        across a boundary is seen whole); the flag marks the last one."""
        fd = self._open(path)
        try:
            carry = b""
            while True:
                chunk = os.read(fd, SCRUB_CHUNK)
                yield carry + chunk, not chunk
                if not chunk:
                    return
                carry = (carry + chunk)[-self.overlap :] if self.overlap else b""
        finally:
            os.close(fd)

    def _holds_key(self, path: Path) -> bool:
        return any(self.pattern.search(buffer) for buffer, _ in self._chunks(path))

    def _rewrite(self, path: Path, info: os.stat_result) -> None:
        """Write the scrubbed copy beside ``path``, then put it in its place."""
        temp = path.with_name(f".osmosis-scrub-{secrets.token_hex(8)}")
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(out, "wb") as sink:
                self._stream_scrubbed(path, sink)
            os.chmod(temp, stat.S_IMODE(info.st_mode) & 0o777 | 0o600)
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

    def _stream_scrubbed(self, path: Path, sink: BinaryIO) -> None:
        fd = self._open(path)
        try:
            pending = b""
            while True:
                chunk = os.read(fd, SCRUB_CHUNK)
                buffer, last = pending + chunk, not chunk
                # A key starting before ``safe`` lies wholly inside the buffer.
                safe = len(buffer) if last else max(0, len(buffer) - self.overlap)
                position = 0
                for match in self.pattern.finditer(buffer):
                    if match.start() >= safe:
                        break
                    sink.write(buffer[position : match.start()] + REDACTED.encode())
                    position = match.end()
                cut = max(position, safe)
                sink.write(buffer[position:cut])
                pending = buffer[cut:]
                if last:
                    return
        finally:
            os.close(fd)

    def rename_if_named(self, directory: Path, name: str) -> None:
        clean = self.redactor.text(name)
        if clean == name:
            return
        try:
            target = _free_name(directory, clean)
            os.rename(directory / name, directory / target)
            self.report.renamed += 1
        except OSError as exc:
            self.report.failures.append(self.redactor.text(f"cannot rename {directory / name}: {exc.strerror}"))


def _free_name(directory: Path, name: str) -> str:
    """``name``, or ``name~N`` for the first N not taken (a rename must never replace an entry)."""
    candidate, n = name, 0
    while os.path.lexists(directory / candidate):
        n += 1
        candidate = f"{name}~{n}"
    return candidate


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
        (trial_dir / MARKER).write_text(OwnerProcess.current().model_dump_json())
        with self._guard:
            self._held[trial_dir] = _Held(redactor)

    def seal(self, trial_dir: Path) -> bool:
        """Scrub ``trial_dir`` of the key, then drop its marker (and the directory when the
        trial never wrote anything into it). A scrub that could not complete fails closed:
        the directory is removed, its marker last (what cannot be removed stays marked, for
        ``sweep_unscrubbed``). Returns True when the directory was removed for that reason."""
        with self._guard:
            held = self._held.get(trial_dir)
        if held is None:
            return False
        removed = False
        with held.lock:
            if not held.sealed:
                removed = not self._scrub(trial_dir, held.redactor)
                if removed:
                    _remove_marker_last(trial_dir)
                else:
                    (trial_dir / MARKER).unlink(missing_ok=True)
                    _remove_if_empty(trial_dir)
                held.sealed = True
        with self._guard:
            self._held.pop(trial_dir, None)
        return removed

    @staticmethod
    def _scrub(trial_dir: Path, redactor: Redactor) -> bool:
        """Whether the scrub completed; what it did and could not do goes to the log, redacted."""
        try:
            report = scrub_tree(trial_dir, redactor)
        except Exception as exc:  # a bug of ours: still never keep the key, never log it
            report = ScrubReport(failures=[redactor.text(f"{type(exc).__name__}: {exc}")])
        for link in report.links:
            logger.warning("replaced %s, a symbolic link whose target held the rollout's API key", link)
        if report.complete:
            return True
        logger.error(
            "removing trial directory %s: %d entr%s could not be scrubbed of the rollout's API key (%s)",
            trial_dir,
            len(report.failures),
            "y" if len(report.failures) == 1 else "ies",
            "; ".join(report.failures[:3]),
        )
        return False

    def seal_all(self, trial_dirs: Iterable[Path]) -> None:
        for trial_dir in trial_dirs:
            self.seal(trial_dir)


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def _remove_marker_last(trial_dir: Path) -> None:
    """Remove a trial directory that may still hold the key, its custody marker last (what
    cannot be removed stays marked, and the next start's ``sweep_unscrubbed`` removes it)."""
    try:
        for child in list(trial_dir.iterdir()):
            if child.name == MARKER:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        if [c.name for c in trial_dir.iterdir()] == [MARKER]:
            (trial_dir / MARKER).unlink()
            _remove_if_empty(trial_dir)
    except OSError as exc:
        logger.error("trial directory %s stays marked as unscrubbed: %s", trial_dir, exc.strerror)


def _owner(marker: Path) -> OwnerProcess | None:
    try:
        return OwnerProcess.model_validate_json(marker.read_text())
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
