"""The direct form of Harbor's sanitising artifact copy (``harbor_compat/artifact_copy.py``) leaves exactly
what Harbor's ``copy_via_tar`` leaves, on generated trees: plain ones (nested and empty
directories, empty files, every mode the ``data`` filter rewrites: setuid, group and other write,
no owner execute, no owner read) and ones it must hand to Harbor's (links inside and out,
dangling and hard links, a fifo, a name that is not ASCII, a file source, a missing source).
Every entry's kind, mode, contents, link target and mtime are compared, as are the refusals."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path
from typing import Any

import pytest
from harbor.environments import tar_transfer

from osmosis_harbor.harbor_compat import artifact_copy
from osmosis_harbor.harbor_compat import fastpaths as harbor_fastpaths

MODES = (0o644, 0o755, 0o600, 0o4755, 0o2775, 0o666, 0o777, 0o744, 0o640, 0o1777, 0o211, 0o070, 0o000)
NAMES = ("a.txt", "run.sh", "sample.json", "x", "trajectory.json", "empty", "long-" + "n" * 120)


def _plain_tree(rng: random.Random, top: Path) -> None:
    directories = [top]
    for depth in range(rng.randint(1, 3)):
        for parent in list(directories):
            if rng.random() < 0.6:
                child = parent / f"d{depth}{rng.randint(0, 9)}"
                child.mkdir(exist_ok=True)
                directories.append(child)
    for directory in directories:
        for name in rng.sample(NAMES, rng.randint(0, 4)):
            path = directory / name
            path.write_bytes(b"" if name == "empty" else rng.randbytes(rng.randint(1, 70000)))
            path.chmod(rng.choice(MODES))
            os.utime(path, (rng.uniform(1e9, 2e9), rng.uniform(1e9, 2e9)))
    for directory in reversed(directories):  # deepest first, so a parent's mtime is its own
        directory.chmod(rng.choice((0o755, 0o700, 0o775, 0o2755)))
        os.utime(directory, (rng.uniform(1e9, 2e9), rng.uniform(1e9, 2e9)))


def _unusual(rng: random.Random, top: Path, outside: Path) -> None:
    """One thing the direct copy must not handle itself."""
    kind = rng.choice(("inside-link", "outside-link", "absolute-link", "dangling", "hard-link", "fifo", "non-ascii"))
    (top / "f.txt").write_text("f")
    if kind == "inside-link":
        (top / "ln").symlink_to("f.txt")
    elif kind == "outside-link":
        (top / "ln").symlink_to(os.path.relpath(outside, top))
    elif kind == "absolute-link":
        (top / "ln").symlink_to(outside)
    elif kind == "dangling":
        (top / "ln").symlink_to("nothing")
    elif kind == "hard-link":
        os.link(top / "f.txt", top / "hard.txt")
    elif kind == "fifo":
        os.mkfifo(top / "pipe")
    else:
        (top / "café.txt").write_text("c")


def _snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root``: kind, mode, contents or link target, and the mtime of files,
    links and empty directories (a non-empty one's is when its last entry was written)."""
    seen: dict[str, tuple[Any, ...]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        relative = path.relative_to(root).as_posix()
        if stat.S_ISLNK(info.st_mode):
            seen[relative] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            empty = not any(path.iterdir())
            seen[relative] = ("dir", stat.S_IMODE(info.st_mode), info.st_mtime if empty else None)
        else:
            seen[relative] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes(), info.st_mtime, info.st_nlink)
    return seen


def _both(source: Path, work: Path) -> tuple[Any, Any]:
    results = []
    for label, copy in (("harbor", tar_transfer.copy_via_tar), ("ours", artifact_copy.copy_via_tar)):
        target = work / label
        try:
            refused: Any = copy(source, target)
        except Exception as exc:  # the same failure is an equal answer
            refused = (type(exc).__name__, str(exc).replace(str(target), "<target>"))
        results.append((refused, _snapshot(target) if target.exists() else None))
    return results[0], results[1]


@pytest.mark.parametrize("seed", range(40))
def test_plain_trees_are_copied_as_harbor_copies_them(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    source = tmp_path / "src" / rng.choice(("agent", "workspace", "artifacts"))
    source.mkdir(parents=True)
    _plain_tree(rng, source)
    assert artifact_copy._plain_tree(str(source)) is not None  # the direct copy is what is tested
    harbors, ours = _both(source, tmp_path / "out")
    assert ours == harbors
    assert ours[0] == []


@pytest.mark.parametrize("seed", range(24))
def test_trees_with_links_or_special_files_get_harbor_s_own_copy(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    source, outside = tmp_path / "src" / "workspace", tmp_path / "outside"
    source.mkdir(parents=True)
    outside.mkdir()
    _plain_tree(rng, source)
    _unusual(rng, source, outside)
    assert artifact_copy._plain_tree(str(source)) is None  # handed to Harbor's
    harbors, ours = _both(source, tmp_path / "out")
    assert ours == harbors


def test_a_file_or_missing_source_gets_harbor_s_own_copy(tmp_path: Path) -> None:
    single = tmp_path / "sample.json"
    single.write_text("{}")
    single.chmod(0o4777)
    for source in (single, tmp_path / "missing", tmp_path / "link-to-dir"):
        if source.name == "link-to-dir":
            source.symlink_to(tmp_path)
        harbors, ours = _both(source, tmp_path / "out" / source.name)
        assert ours == harbors


def test_a_copy_over_an_earlier_one_is_harbor_s_too(tmp_path: Path) -> None:
    """Copied twice into the same place (a directory already there is kept, a file rewritten)."""
    source = tmp_path / "src" / "agent"
    source.mkdir(parents=True)
    _plain_tree(random.Random(7), source)
    copies = (tar_transfer.copy_via_tar, artifact_copy.copy_via_tar)
    for copy in copies:
        copy(source, tmp_path / copy.__module__)
    (source / "later.txt").write_text("written after the first copy")
    again = [(copy(source, tmp_path / copy.__module__), _snapshot(tmp_path / copy.__module__)) for copy in copies]
    assert again[0] == again[1]
    assert "agent/later.txt" in again[1][1]


def test_it_replaces_harbor_s_in_the_artifact_handler() -> None:
    from harbor.trial import artifact_handler

    harbor_fastpaths.install()
    label = "harbor.trial.artifact_handler:copy_via_tar"
    if label not in harbor_fastpaths.installed():
        pytest.skip("this Harbor or Python is not the verified version")
    assert artifact_handler.copy_via_tar is artifact_copy.copy_via_tar
    assert harbor_fastpaths.original(label) is tar_transfer.copy_via_tar
