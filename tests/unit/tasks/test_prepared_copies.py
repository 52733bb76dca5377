"""Per-rollout task copies hard-linked from a copy prepared once (``tasks/prepared.py``) share
inodes with it, so nothing may write a copied file in place: our own writes replace the name
(``write_file``; the positive control shows a write in place through a link does reach the
other name), a rollout's own files are new inodes, a task edited in place is prepared again,
and ``assert_prepared_unchanged`` (called after real rollouts in ``test_backend_e2e.py``)
shows that a rollout left the prepared copy's bytes and modes as a fresh preparation makes them.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from osmosis_harbor.shim.models import GradingInput
from osmosis_harbor.tasks import prepared as prepared_module
from osmosis_harbor.tasks.files import write_file
from osmosis_harbor.tasks.materialize import prepare_task, stage_rollout
from osmosis_harbor.tasks.prepared import PreparedCopies
from osmosis_harbor.tasks.refs import ResolvedTask
from tests.support.common import graded_template


def test_write_file_replaces_a_hard_linked_file_and_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared.txt"
    shared.write_text("template")
    shared.chmod(0o640)
    control = tmp_path / "control.txt"
    os.link(shared, control)
    control.write_text("written in place")  # positive control: a write through a link
    assert shared.read_text() == "written in place"

    shared.write_text("template")
    linked = tmp_path / "linked.txt"
    os.link(shared, linked)
    write_file(linked, "the rollout's")
    assert shared.read_text() == "template" and linked.read_text() == "the rollout's"
    assert os.stat(linked).st_ino != os.stat(shared).st_ino
    assert (os.stat(linked).st_mode & 0o777) == 0o640  # as a write in place kept it
    write_file(linked, "x", mode=0o755)
    assert (os.stat(linked).st_mode & 0o777) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control.txt", "linked.txt", "shared.txt"]  # no temp left


def _tree(root: Path) -> dict[str, tuple[int, bytes | str | None]]:
    """Every entry under ``root``: its mode and its bytes (a link's target; None: a directory)."""
    out: dict[str, tuple[int, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            content: bytes | str | None = os.readlink(path)
        elif path.is_dir():
            content = None
        else:
            content = path.read_bytes()
        out[str(path.relative_to(root))] = (info.st_mode, content)
    return out


def test_copies_link_the_prepared_files_and_own_their_rollout_files(tmp_path: Path) -> None:
    template = graded_template(tmp_path)
    (template / "tests").mkdir()
    (template / "tests" / "data.txt").write_text("shared data")
    os.symlink("data.txt", template / "tests" / "alias.txt")
    task = ResolvedTask(task_id="t", path=template, source="template")
    prepared = PreparedCopies(lambda: tmp_path / "prepared")
    made: list[Path] = []

    def prepare(dest: Path) -> Any:
        made.append(dest)
        return prepare_task(task, dest, grade_command="/bin/sh /tests/g.sh", isolate_grader=True)

    copies = []
    for n in range(2):
        copy = prepared.link("k", template, prepare, tmp_path / f"copy{n}")
        copies.append(
            stage_rollout(copy, "t", instruction=f"prompt {n}", grading_input={"rollout_id": f"r{n}", "label": str(n)})
        )
    assert len(made) == 1  # prepared once for both
    base = made[0]
    before = _tree(base)
    for n, copy in enumerate(copies):
        assert copy.generated_tests and copy.verifier_isolated and copy.instruction_replaced
        assert (copy.path / "instruction.md").read_text() == f"prompt {n}"
        written = GradingInput.model_validate_json((copy.path / "tests" / "osmosis_grading_input.json").read_text())
        assert (written.rollout_id, written.label) == (f"r{n}", str(n))
        assert os.stat(copy.path / "task.toml").st_ino == os.stat(base / "task.toml").st_ino  # linked
        assert os.stat(copy.path / "instruction.md").st_ino != os.stat(base / "instruction.md").st_ino
        assert os.readlink(copy.path / "tests" / "alias.txt") == "data.txt"
        assert (copy.path / "tests" / "alias.txt").read_text() == "shared data"
    assert (base / "instruction.md").read_bytes() == (template / "instruction.md").read_bytes()
    assert not (base / "tests" / "osmosis_grading_input.json").exists()
    assert _tree(base) == before
    # the copies equal a copy made the old way, bar the rollout's own files
    fresh = stage_rollout(prepare_task(task, tmp_path / "fresh", grade_command="/bin/sh /tests/g.sh",
                                       isolate_grader=True), "t", instruction="prompt 0", grading_input={"rollout_id": "r0", "label": "0"})  # fmt: skip
    assert _tree(fresh.path) == _tree(copies[0].path)

    # a task edited in place is prepared again, and the old prepared copy goes
    (template / "tests" / "data.txt").write_text("edited")
    third = prepared.link("k", template, prepare, tmp_path / "copy2")
    assert len(made) == 2 and not base.exists()
    assert (third.path / "tests" / "data.txt").read_text() == "edited"
    assert (copies[0].path / "tests" / "data.txt").read_text() == "shared data"  # an earlier copy keeps its own


def assert_prepared_unchanged(backend: Any, tmp_path: Path) -> int:
    """Each of ``backend``'s prepared copies, after its rollouts ran, has exactly the bytes and
    modes of a fresh preparation of its task. Returns how many were checked."""
    entries = backend.planner._prepared._entries
    for n, ((task_path, grade_command, carried, guarded), entry) in enumerate(entries.items()):
        task = ResolvedTask(task_id="t", path=Path(task_path), source="template")
        fresh = backend.planner._prepare(task, grade_command, carried, guarded, tmp_path / f"fresh-prepared-{n}")
        assert _tree(entry.copy.path) == _tree(fresh.path), f"the prepared copy of {task_path} changed"
        shutil.rmtree(fresh.path)
    return len(entries)


def test_a_file_that_cannot_be_linked_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another file system (EXDEV): the copy gets the same bytes and modes, its own inodes."""
    template = graded_template(tmp_path)

    def cross_device(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(prepared_module.os, "link", cross_device)
    prepared_module.link_tree(template, tmp_path / "copy")
    assert _tree(tmp_path / "copy") == _tree(template)
    assert os.stat(tmp_path / "copy" / "task.toml").st_ino != os.stat(template / "task.toml").st_ino
