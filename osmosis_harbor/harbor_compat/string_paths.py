"""pathlib's answers computed on strings: the same results (errors included) as the ``Path``
calls Harbor's task checks make, without building a path object per step."""

from __future__ import annotations

import os
import stat
from errno import EBADF, ELOOP, ENOENT, ENOTDIR
from pathlib import Path

__all__ = ["child", "is_dir", "relative", "resolve", "resolve_below", "within"]

# What ``Path.is_dir`` treats as "not a directory" rather than raising.
IGNORED_ERRNOS = (ENOENT, ENOTDIR, EBADF, ELOOP)


def resolve(path: str) -> str:
    """``str(Path(path).resolve())``, errors included (``RuntimeError`` on a link loop)."""
    return str(Path(path).resolve())


def resolve_below(path: str, root: str) -> str:
    """``resolve(path)`` for a normalized ``path`` within ``root``, ``root`` being resolved
    already (``TaskFileFilter`` resolves its task directory when made): only the components
    below ``root`` are looked at, and any link among them takes the exact route."""
    below = relative(path, root)
    if below == ".":
        return resolve(path)
    current = root
    for part in below.split("/"):
        current = child(current, part)
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return resolve(path)
        except OSError:
            return resolve(path)
    return path


def is_dir(path: str) -> bool:
    """``Path(path).is_dir()``: follows links; missing, dangling or looping is ``False``."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno not in IGNORED_ERRNOS:
            raise
        return False
    except ValueError:
        return False


def within(path: str, root: str) -> bool:
    """``Path(path).is_relative_to(root)`` for normalized absolute paths."""
    return path == root or path.startswith(root if root.endswith("/") else root + "/")


def relative(path: str, root: str) -> str:
    """``Path(path).relative_to(root).as_posix()`` for a normalized ``path`` within ``root``."""
    if path == root:
        return "."
    return path[len(root) :] if root.endswith("/") else path[len(root) + 1 :]


def child(parent: str, name: str) -> str:
    """``str(Path(parent) / name)`` as ``iterdir`` yields it."""
    if parent == ".":
        return name
    return parent + name if parent.endswith("/") else parent + "/" + name
