"""Reading the files a sandbox left in a trial directory, on the host, without trusting them.

A policy under training is root in its sandbox, so ``sample.json``, ``error.json``, reward
files, exit codes and trajectories are attacker-made. A FIFO there blocks a plain ``open``
forever (on the event loop, it freezes the whole server); a symbolic link makes a host file
the rollout's result; a megabyte of ``[`` makes ``json.loads`` raise ``RecursionError``; a
gigabyte fills host memory. So every such file is read here, and only here:

* the path is walked beneath the trial directory through directory file descriptors, each
  component opened with ``O_NOFOLLOW`` (no link is followed on the host, not even a
  directory link);
* the file is used only if ``lstat`` says regular file, opened ``O_RDONLY | O_NONBLOCK |
  O_NOFOLLOW`` (so nothing can block), and ``fstat`` on the open descriptor must agree;
* at most the bound of its kind is read (``Settings.max_*_bytes``);
* JSON is parsed with a depth bound (``Settings.max_json_depth``);
* a lone surrogate (``"\\ud800"`` is valid JSON, but no UTF-8 text can hold it) is spelled as
  its escape in every string, keys included, before anyone sees the document. Without this, the
  first encoder downstream raised: Harbor's exception record (a workflow's own failure turned
  ``internal_error``), the workers' wire (a rollout that never ended), the server's answer.
  This is the one place sandbox JSON enters the host, so it is made safe here, not at each sink.

A missing file is ``None``; anything else unusable raises `ContractFileError`, whose
message names the file by its place in the trial directory. The calls block on disk I/O:
async callers run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict

from osmosis_harbor import settings
from osmosis_harbor.errors import ContractFileError
from osmosis_harbor.trials.printable import json_safe

__all__ = ["ContractBounds", "ContractFileError", "FileKind", "read_bytes", "read_json", "read_text"]

_CHUNK = 1 << 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
# Strict UTF-8 decoding refuses encoded surrogates, so the only way a JSON document gets a lone
# one is this escape (a pair is an escape too, and only an actual lone one is rewritten).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class FileKind(StrEnum):
    """What a file is for, which sets its size bound."""

    SAMPLE = "sample"
    ERROR = "error"
    REWARD = "reward"
    TRAJECTORY = "trajectory"


class ContractBounds(BaseModel):
    """The bounds files a sandbox wrote are read within (``Settings.max_*_bytes``,
    ``max_json_depth``), made once by the reader's owner from its settings and carried (a
    model: it crosses to Harbor's agents in their kwargs)."""

    model_config = ConfigDict(frozen=True)

    max_sample_bytes: int
    max_error_bytes: int
    max_reward_bytes: int
    max_trajectory_bytes: int
    max_json_depth: int

    @classmethod
    def of(cls, config: settings.Settings) -> ContractBounds:
        """The bounds ``config`` gives (its fields of the same names)."""
        return cls.model_validate(config, from_attributes=True)

    def size(self, kind: FileKind) -> int:
        return {
            FileKind.SAMPLE: self.max_sample_bytes,
            FileKind.ERROR: self.max_error_bytes,
            FileKind.REWARD: self.max_reward_bytes,
            FileKind.TRAJECTORY: self.max_trajectory_bytes,
        }[kind]


def _what(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _parts(relative: str | PurePosixPath) -> tuple[str, ...]:
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or any(p in ("..", ".") for p in parts):
        raise ValueError(f"a contract file is named by a plain relative path, got {str(relative)!r}")
    return parts


def _open_parent(root: Path, parts: tuple[str, ...], relative: str) -> int | None:
    """A descriptor of the file's directory, walked beneath ``root`` without following links;
    None when ``root`` or a directory on the way does not exist."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the host made the root
    except FileNotFoundError:
        return None
    for part in parts[:-1]:
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            os.close(fd)
            return None
        except OSError as exc:
            os.close(fd)
            raise ContractFileError(relative, f"{part} is not a plain directory ({exc.strerror})") from None
        os.close(fd)
        fd = child
    return fd


def read_bytes(
    root: Path, relative: str | PurePosixPath, kind: FileKind, bounds: ContractBounds, *, limit: int | None = None
) -> bytes | None:
    """The content of ``root/relative`` if it is a regular file within the bound of ``kind``
    (or ``limit``); None when it does not exist; `ContractFileError` for anything else."""
    name = str(relative)
    parts = _parts(relative)
    bound = limit if limit is not None else bounds.size(kind)
    parent = _open_parent(Path(root), parts, name)
    if parent is None:
        return None
    try:
        return _read_regular(parent, parts[-1], name, bound)
    finally:
        os.close(parent)


def _read_regular(parent: int, leaf: str, name: str, bound: int) -> bytes | None:
    try:
        before = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(before.st_mode):
        raise ContractFileError(name, f"{_what(before.st_mode)}, not a regular file: not read")
    if before.st_size > bound:
        raise ContractFileError(name, f"{before.st_size} bytes, over the {bound}-byte bound: not read")
    try:
        fd = os.open(leaf, _FILE_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a link swapped in since the lstat
        reason = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ContractFileError(name, f"cannot be opened safely ({reason})") from None
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise ContractFileError(name, "replaced while being opened: not read")
        return _read_bounded(fd, name, bound)
    finally:
        os.close(fd)


def _read_bounded(fd: int, name: str, bound: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = os.read(fd, min(_CHUNK, bound + 1 - size))
        except OSError as exc:
            raise ContractFileError(name, f"cannot be read ({exc.strerror})") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > bound:  # it grew since the lstat
            raise ContractFileError(name, f"over the {bound}-byte bound: not read")


def read_text(
    root: Path, relative: str | PurePosixPath, kind: FileKind, bounds: ContractBounds, *, limit: int | None = None
) -> str | None:
    """``read_bytes`` decoded as UTF-8."""
    data = read_bytes(root, relative, kind, bounds, limit=limit)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractFileError(str(relative), f"not UTF-8 text (byte {exc.start})") from None


def read_json(
    root: Path,
    relative: str | PurePosixPath,
    kind: FileKind,
    bounds: ContractBounds,
    *,
    limit: int | None = None,
    max_depth: int | None = None,
) -> Any:
    """The JSON document in ``root/relative`` (None when there is no such file), nested at
    most ``max_depth`` deep (``Settings.max_json_depth`` by default), every string of it
    encodable (lone surrogates spelled as escapes)."""
    text = read_text(root, relative, kind, bounds, limit=limit)
    if text is None:
        return None
    depth = max_depth if max_depth is not None else bounds.max_json_depth
    try:
        document = json.loads(text)
    except RecursionError:  # deeper than the interpreter parses: far over any bound
        raise ContractFileError(str(relative), f"JSON nested deeper than {depth} levels") from None
    except ValueError as exc:
        raise ContractFileError(str(relative), f"not JSON ({exc})") from None
    if _deeper_than(document, depth):
        raise ContractFileError(str(relative), f"JSON nested deeper than {depth} levels")
    return json_safe(document) if _SURROGATE_ESCAPE.search(text) else document


def _deeper_than(document: Any, bound: int) -> bool:
    """Whether ``document`` nests containers more than ``bound`` deep (iteratively: the check
    must not recurse either)."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > bound:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
