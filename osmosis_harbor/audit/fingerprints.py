"""What the audit looks for of a task's own files: the hashes, sizes and distinctive lines of
its ``tests/`` and ``solution/``, computed on the host from the task directory.

A file shorter than ``MIN_BYTES`` (32 bytes) is not looked for: a one-line ``reward.txt`` or an
empty ``__init__.py`` is equal to countless innocent files. A *distinctive line* is one of at
least ``MIN_LINE`` characters that is not boilerplate (a shebang, ``set -e``...); a few per file,
the longest first, are what ``grep -F`` looks for in the image. A file of ``tests/`` that is not
code (``expected.txt``, ``answer.json``) is taken for an expected output: a copy of it in the
image hands the agent the answer, so it is an error; the rest is a warning.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import BaseModel

__all__ = ["MIN_BYTES", "MIN_LINE", "Fingerprint", "fingerprints", "is_expected_output"]

MIN_BYTES = 32
MIN_LINE = 32
MAX_LINE = 200  # a longer line is cut to its first MAX_LINE characters (still a fixed string)
LINES_PER_FILE = 3
MAX_LINES = 48  # per task: what one grep command line carries
MAX_FILES = 2000  # per task directory walked
_CODE_SUFFIXES = frozenset(
    ".sh .bash .py .pyi .js .ts .rb .go .rs .c .h .cc .cpp .java .kt .pl .php .lua .r .toml .cfg .ini "
    ".yaml .yml .lock .mk .cmake .gradle".split()
)
_CODE_NAMES = frozenset({"Dockerfile", "Makefile", "conftest.py", "requirements.txt", "package.json"})


class Fingerprint(BaseModel):
    """One file of the task that the image must not hold."""

    role: str  # "tests" or "solution"
    relpath: str  # e.g. tests/expected.txt
    size: int
    sha256: str
    expected_output: bool
    lines: list[str] = []


def is_expected_output(relpath: str) -> bool:
    path = Path(relpath)
    return path.parts[0] == "tests" and path.name not in _CODE_NAMES and path.suffix.lower() not in _CODE_SUFFIXES


def _distinctive(data: bytes) -> list[str]:
    if b"\0" in data[:8192]:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    found: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()[:MAX_LINE]
        # quotes, backslashes and leading dashes are safe in a quoted -e argument, but a line
        # of punctuation (a separator) is in too many files to mean anything
        if len(line) < MIN_LINE or line.startswith("#!") or sum(c.isalnum() for c in line) < MIN_LINE // 2:
            continue
        if line not in found:
            found.append(line)
    return sorted(found, key=len, reverse=True)[:LINES_PER_FILE]


def fingerprints(task_dir: Path, *, max_file_bytes: int) -> list[Fingerprint]:
    """The files of ``task_dir``'s ``tests/`` and ``solution/`` worth looking for (symlinks are
    not followed; files over ``max_file_bytes`` are not read)."""
    found: list[Fingerprint] = []
    for role in ("tests", "solution"):
        root = task_dir / role
        if not root.is_dir() or root.is_symlink():
            continue
        walked = 0
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in {"__pycache__", ".git"})
            for name in sorted(filenames):
                walked += 1
                if walked > MAX_FILES:
                    break
                path = Path(dirpath) / name
                if path.is_symlink() or not path.is_file():
                    continue
                size = path.stat().st_size
                if size < MIN_BYTES or size > max_file_bytes:
                    continue
                data = path.read_bytes()
                relpath = path.relative_to(task_dir).as_posix()
                found.append(
                    Fingerprint(
                        role=role,
                        relpath=relpath,
                        size=size,
                        sha256=hashlib.sha256(data).hexdigest(),
                        expected_output=is_expected_output(relpath),
                        lines=_distinctive(data),
                    )
                )
    return found
