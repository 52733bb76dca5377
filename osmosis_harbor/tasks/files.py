"""Writing our own files into a task copy."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

__all__ = ["write_file"]

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_file(path: Path, data: str, mode: int | None = None) -> None:
    """Write a file of ours by replacing whatever is at that name, never writing through it.

    A task copy's files may be hard links to a prepared template (``tasks/prepared.py``) and
    a symlink may point anywhere in the task: so the bytes go to a new file beside it, which
    is then renamed over the name. The old inode, and every other name it has, keep their
    bytes. Without ``mode`` the new file keeps the mode of the regular file it replaces (as a
    write in place did), else it gets a new file's default (0666 less the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            old = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISREG(old.st_mode):
                mode = stat.S_IMODE(old.st_mode)
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(temporary, _NEW_FILE, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(data)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
