"""Task copies prepared once per template, from which each rollout's copy is hard-linked.

Why: copying the task afresh for every rollout would stage the same files in each
copy (the patched Dockerfile, the bundle wheel and its requirements, the isolated verifier's
``task.toml``, the generated ``test.sh`` and grade script): byte copies, a walk for links,
TOML rewrites and a wheel compared byte for byte, the same result each time. Only
``instruction.md`` and the grading input differ between rollouts. So the shared part is made
once (per task directory and plan shape, again whenever the task's tree changed) into a
private directory, and a rollout's copy is that tree with its files hard-linked.

Why a shared inode is safe here: nothing writes a copied file in place. Our own staging goes
through ``write_file``, which renames a new file over the name (the linked inode keeps its
bytes); Harbor and the sandbox environment only read the task (its load, hashes, image build
context and uploads: the sandbox gets bytes, never the host file); the key scrub walks trial
directories, never the task copy. ``tests/unit/tasks/test_prepared_copies.py`` checks that a prepared
template's bytes are unchanged after a rollout whose copy was rewritten.

The tree's signature (each entry's kind, mode, size, inode, mtime and ctime, and link
targets) is read per rollout: a task edited in place is prepared again before its next copy.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path

from osmosis_harbor.tasks.materialize import MaterializedTask

__all__ = ["PreparedCopies", "link_tree", "tree_signature"]

CAPACITY = 64
_CANNOT_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP})

Signature = tuple[tuple[str, int, int, int, int, int, str | None], ...]


def tree_signature(root: Path) -> Signature:
    """What changes when anything in the tree under ``root`` does (links are not followed)."""
    entries: list[tuple[str, int, int, int, int, int, str | None]] = []
    pending = [(os.fspath(root), "")]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as listing:
            for entry in listing:
                info = entry.stat(follow_symlinks=False)
                name = prefix + entry.name
                link = os.readlink(entry.path) if entry.is_symlink() else None
                entries.append(
                    (name, info.st_mode, info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns, link)
                )
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, name + "/"))
    return tuple(sorted(entries))


def link_tree(prepared: Path, dest: Path) -> None:
    """``dest`` (absent or empty) becomes ``prepared``'s tree: directories made with their
    modes, symlinks made again, files hard-linked (copied where the file system cannot link
    them: another device, no hard links, the link count at its limit)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"link_tree: {dest} already exists and is not an empty directory")
    shutil.copytree(prepared, dest, symlinks=True, copy_function=_link_or_copy, dirs_exist_ok=dest.exists())


def _link_or_copy(source: str, dest: str) -> None:
    try:
        os.link(source, dest, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _CANNOT_LINK:
            raise
        shutil.copy2(source, dest, follow_symlinks=False)


@dataclasses.dataclass(frozen=True)
class _Prepared:
    signature: Signature
    copy: MaterializedTask


class PreparedCopies:
    """One owner's prepared task copies, under the private directory ``root()`` names (asked
    for on the first preparation, so an owner that never copies a task makes none; the owner
    removes it).

    At most ``CAPACITY`` are kept, the least recently used going first. Preparing and linking
    hold one lock, so a prepared tree is never removed while a rollout's copy is linked from it.
    """

    def __init__(self, root: Callable[[], Path], capacity: int = CAPACITY) -> None:
        self.root = root
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, _Prepared] = OrderedDict()
        self._lock = threading.Lock()

    def link(
        self, key: Hashable, source: Path, prepare: Callable[[Path], MaterializedTask], dest: Path
    ) -> MaterializedTask:
        """``dest`` becomes a copy of ``source`` as ``prepare`` makes one (its files linked from
        the copy prepared under ``key``, which is made, or made again when ``source`` changed)."""
        signature = tree_signature(source)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.signature != signature:
                entry = self._prepare(key, signature, prepare)
            self._entries.move_to_end(key)
            try:
                link_tree(entry.copy.path, dest)
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)
                raise
        return dataclasses.replace(entry.copy, path=dest)

    def _prepare(self, key: Hashable, signature: Signature, prepare: Callable[[Path], MaterializedTask]) -> _Prepared:
        stale = self._entries.pop(key, None)
        if stale is not None:
            shutil.rmtree(stale.copy.path, ignore_errors=True)
        root = self.root()
        root.mkdir(parents=True, exist_ok=True)
        entry = _Prepared(signature, prepare(root / uuid.uuid4().hex))
        self._entries[key] = entry
        while len(self._entries) > self.capacity:
            _, oldest = self._entries.popitem(last=False)
            shutil.rmtree(oldest.copy.path, ignore_errors=True)
        return entry
