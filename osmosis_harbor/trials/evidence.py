"""Why a trial scored what it scored: the tail of the verifier's (or ``solve.sh``'s) output.

A verdict of "reward 0 (expected 1)" is useless once the trial directory is deleted, so
validation keeps the last lines of Harbor's ``verifier/test-stdout.txt`` (``test.sh``'s stdout
and stderr together) and of the oracle's ``agent/oracle.txt`` in its report.

Everything here was written by a sandbox, so it is read as hostile: only a regular file
(``lstat``), opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO or a link planted there can neither
block nor redirect the read), bounded in bytes and lines, and with host secrets redacted. Package
managers' progress lines are left out of a tail (``trials.progress_lines``); control characters
stay, for whoever shows the tail to escape (``trials.printable``).

It also decides one rule of the verdict table: **the verifier did not run its tests**. Harbor
discards ``test.sh``'s exit status, so the rule reads its output. It holds when no reward
channel is above 0, the output has a line showing that the test runner could not start
(``RUNNER_FAILED``: a shell's ``command not found``, uv's ``No interpreter found`` or
``Failed to ...``, pip's ``Could not find a version`` / ``No matching distribution``, apt's
``Unable to locate package``, ``No module named pytest``), and nothing shows that tests ran:
no runner banner or summary in the output (``TESTS_RAN``: pytest's ``test session starts`` /
``collected N items`` / ``N passed``, unittest's ``Ran N tests``) and no test report beside it
(``*.xml``, ``ctrf*.json``, ``*report*.json`` in ``verifier/``).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from osmosis_harbor import settings
from osmosis_harbor.shim.errors import REDACTED
from osmosis_harbor.trials.progress_lines import without_progress

__all__ = [
    "SCAN_BYTES",
    "TAIL_BYTES",
    "TAIL_LINES",
    "host_secrets",
    "output_tail",
    "redacted",
    "runner_never_started",
]

TAIL_BYTES = 2048
TAIL_LINES = 20
SCAN_BYTES = 64 * 1024  # how much of the output the did-not-run rule reads
PROGRESS_READ_FACTOR = 8  # a tail without progress lines is read from this many times its bound
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_MIN_SECRET = 8

RUNNER_FAILED = re.compile(
    r"command not found"
    r"|^(?:/bin/)?(?:ba|da)?sh: \d+: \S+: not found"
    r"|No interpreter found"
    r"|^error: Failed to (?:download|fetch|build|install|resolve|spawn|query)"
    r"|No solution found when resolving"
    r"|ERROR: Could not find a version that satisfies"
    r"|ERROR: No matching distribution found"
    r"|^E: (?:Unable to locate package|Package '.*' has no installation candidate)"
    r"|No module named '?(?:pytest|pip|uv)\b",
    re.MULTILINE,
)
TESTS_RAN = re.compile(
    r"test session starts|collected \d+ items?|^Ran \d+ tests? in"
    r"|^=+ .*\b\d+ (?:passed|failed|errors?)\b|^(?:PASSED|FAILED) \S+::",
    re.MULTILINE,
)
_REPORT = re.compile(r"(?:\.xml|^ctrf.*\.json|report.*\.json)$", re.IGNORECASE)


def host_secrets() -> tuple[str, ...]:
    """Values of this host's secret-looking variables (a task's ``[verifier.env]`` may pass them
    into the sandbox, and its output may echo them), longest first."""
    env = settings.child_environment()
    values = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET}
    return tuple(sorted(values, key=len, reverse=True))


def redacted(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (longest first, as ``host_secrets`` gives them) replaced."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def _read_end(path: Path, limit: int) -> bytes | None:
    """Up to the last ``limit`` bytes of ``path`` if it is a regular file, never following a
    link and never blocking on a FIFO."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped between lstat and open
            return None
        if info.st_size > limit:
            os.lseek(fd, info.st_size - limit, os.SEEK_SET)
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def output_tail(
    path: Path,
    secrets: Iterable[str] = (),
    *,
    max_lines: int = TAIL_LINES,
    max_bytes: int = TAIL_BYTES,
    drop_progress: bool = True,
) -> str | None:
    """The last lines of ``path`` (at most ``max_lines`` and about ``max_bytes``), redacted;
    None when it is absent, not a regular file or blank. With ``drop_progress``, package
    managers' progress lines are left out first (``trials.progress_lines``), so the tail is
    read from further back."""
    secrets = tuple(secrets)
    longest = max((len(s.encode()) for s in secrets), default=0)
    window = (max_bytes * PROGRESS_READ_FACTOR if drop_progress else max_bytes) + longest
    data = _read_end(path, window)  # a secret cut at the boundary is still whole
    if data is None:
        return None
    text = redacted(data.decode("utf-8", errors="replace"), secrets).replace("\r\n", "\n")
    lines = [line.rstrip() for line in text.split("\n")]  # a lone \r is a redraw, not a line end
    cut = len(data) >= window
    if cut and len(lines) > 1:
        lines = lines[1:]  # the first line read is likely partial
    if drop_progress:
        lines = list(without_progress(lines))
    while lines and not lines[-1].strip():
        lines.pop()
    tail = "\n".join(lines[-max_lines:])
    while len(tail.encode()) > max_bytes and "\n" in tail:
        tail = tail.split("\n", 1)[1]
    if len(tail.encode()) > max_bytes:  # one long line: its end
        tail = "…" + tail.encode()[-(max_bytes - 3) :].decode("utf-8", errors="ignore")
    return tail or None


def runner_never_started(verifier_dir: Path, rewards: dict[str, float], secrets: Iterable[str] = ()) -> str | None:
    """The output line showing the test runner never started, when the rule in this module's
    docstring holds; None otherwise."""
    if any(value > 0 for value in rewards.values()):
        return None
    output = output_tail(
        verifier_dir / "test-stdout.txt", secrets, max_lines=100_000, max_bytes=SCAN_BYTES, drop_progress=False
    )
    if output is None:
        return None
    failed = RUNNER_FAILED.search(output)
    if failed is None or TESTS_RAN.search(output):
        return None
    try:
        names = [entry.name for entry in os.scandir(verifier_dir) if entry.is_file(follow_symlinks=False)]
    except OSError:
        names = []
    if any(_REPORT.search(name) for name in names):
        return None
    start = output.rfind("\n", 0, failed.start()) + 1
    end = output.find("\n", failed.end())
    return output[start : end if end != -1 else len(output)].strip()
