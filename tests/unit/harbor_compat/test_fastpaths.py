"""The fast forms of Harbor's task checks answer exactly as Harbor's own, on trees Harbor's own
rules make interesting: ``.harborignore`` files at several depths (negations, anchors, directory
patterns), links inside the task, out of it, dangling, looping and forming directory cycles,
and step directories. Every answer is compared, errors included (type and message)."""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from harbor.models.task.file_filter import TaskFileFilter

from osmosis_harbor import settings
from osmosis_harbor.harbor_compat import fastpaths as harbor_fastpaths

DIRS = ("", "tests", "tests/sub", "tests/sub/deep", "solution", "solution/x", "environment", "steps/s1",
        "steps/s1/tests", "steps/s1/solution", "other")  # fmt: skip
FILES = ("a.txt", "b.py", "keep.txt", "test.sh", "data.json", "solve.sh", "Dockerfile")
RULES = ("*.txt", "!keep.txt", "sub/", "/a.txt", "**/deep", "b.py", "# a comment", "", "data*", "!sub/", "deep/",
         "/sub", "*", "!*.sh", "x/")  # fmt: skip
TASK_TOML = '[verifier]\ntimeout_sec = 30.0\n\n[agent]\ntimeout_sec = 30.0\n\n[[steps]]\nname = "s1"\n'


def build_tree(rng: random.Random, top: Path) -> Path:
    """A task under ``top/task`` (and an ``outside`` directory next to it for links to leave to)."""
    task, outside = top / "task", top / "outside"
    (outside / "d").mkdir(parents=True)
    (outside / "secret.txt").write_text("x")
    dirs = [d for d in DIRS if d == "" or rng.random() < 0.75]
    for d in dirs:
        (task / d).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(TASK_TOML if rng.random() < 0.3 else TASK_TOML.split("[[steps]]")[0])
    (task / "instruction.md").write_text("do it")
    if rng.random() < 0.3:  # the trial lock's hash honours a task's .gitignore
        (task / ".gitignore").write_text("\n".join(rng.sample(("*.json", "tests/sub/", "!keep.txt", "*.sh", "x"), 2)))
    made: list[Path] = []
    for d in dirs:
        for name in rng.sample(FILES, rng.randint(0, 3)):
            (task / d / name).write_text(name)
            made.append(task / d / name)
        if d and rng.random() < 0.5:
            (task / d / ".harborignore").write_text("\n".join(rng.sample(RULES, rng.randint(1, 4))) + "\n")
    existing = [task / d for d in dirs] + made
    for i in range(rng.randint(0, 4)):
        where = task / rng.choice(dirs)
        link = where / f"ln{i}"
        kind = rng.choice(("inside", "inside-abs", "outside", "outside-abs", "dangling", "self", "ancestor"))
        target: str
        if kind == "inside":
            target = os.path.relpath(rng.choice(existing), where)
        elif kind == "inside-abs":
            target = str(rng.choice(existing))
        elif kind == "outside":
            target = os.path.relpath(outside / rng.choice(("d", "secret.txt")), where)
        elif kind == "outside-abs":
            target = str(outside)
        elif kind == "dangling":
            target = "nothing-here"
        elif kind == "self":
            target = link.name
        else:
            target = os.path.relpath(
                rng.choice([task / d for d in dirs if (task / d) in where.parents or d == ""]), where
            )
        if not link.exists() and not link.is_symlink():
            link.symlink_to(target)
    return task


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = call()
    except Exception as exc:  # the comparison includes which error and its message
        return ("error", type(exc).__name__, str(exc))
    if hasattr(value, "relative_paths"):
        value = (value.source_dir, value.relative_paths, value.includes_all_entries)
    return ("ok", value)


def every_path(task: Path) -> list[Path]:
    found = [task, task / "missing", task / "tests" / "missing.txt", task.parent / "outside" / "secret.txt"]
    for dirpath, dirnames, filenames in os.walk(task):
        found += [Path(dirpath) / n for n in sorted(dirnames) + sorted(filenames)]
    return found


def outcomes(task: Path) -> dict[str, tuple[Any, ...]]:
    """Every answer the replaced functions give on ``task``, through the names Harbor calls."""
    from harbor.models.task import file_filter as file_filter_module
    from harbor.models.task.paths import TaskPaths
    from harbor.models.task.task import Task
    from harbor.publisher.packager import Packager

    results: dict[str, tuple[Any, ...]] = {}
    paths = TaskPaths(task)
    dirs = [task, paths.tests_dir, paths.solution_dir, paths.environment_dir, task / "steps" / "s1", task / "other"]
    for path in every_path(task):
        fresh = TaskFileFilter(task)  # a fresh filter: its ignore specs are read again
        results[f"excluded {path}"] = _outcome(partial(fresh.is_excluded, path))
    for d in dirs:
        fresh = TaskFileFilter(task)
        results[f"validate {d}"] = _outcome(partial(paths.validate_input_tree, d, exclude=fresh.is_excluded))
        results[f"validate-all {d}"] = _outcome(partial(paths.validate_input_tree, d))
        results[f"select {d}"] = _outcome(partial(TaskFileFilter(task).select, d))
        results[f"select-files {d}"] = _outcome(
            partial(file_filter_module.select_files, d, exclude=TaskFileFilter(task).is_excluded)
        )
    results["content hash"] = _outcome(lambda: Packager.compute_content_hash(task))
    results["collected"] = _outcome(lambda: Packager.collect_files(task))
    results["task"] = _outcome(lambda: (lambda t: (t.name, t.instruction, t.checksum))(Task(task)))
    results["task unverified"] = _outcome(lambda: Task(task, disable_verification=True).name)
    return results


@contextmanager
def harbor_own() -> Iterator[None]:
    """Harbor's original functions for the duration."""
    harbor_fastpaths.uninstall()
    try:
        yield
    finally:
        harbor_fastpaths.install(settings.current())


def compare(task: Path) -> tuple[list[str], dict[str, tuple[Any, ...]]]:
    """The differences between Harbor's answers and the fast ones, and Harbor's answers."""
    with harbor_own():
        expected = outcomes(task)
    got = outcomes(task)
    return [
        f"{key}: Harbor {expected[key]} != fast {got[key]}" for key in expected if expected[key] != got[key]
    ], expected


@pytest.fixture(autouse=True)
def fastpaths_installed() -> None:
    assert harbor_fastpaths.install(settings.current()) == tuple(f.label for f in harbor_fastpaths.FASTPATHS)


def test_fast_answers_equal_harbor_own_on_generated_trees(tmp_path: Path) -> None:
    """30 seeded trees (reproducible: the failing seed is in the message). Across them Harbor's own
    answers exclude files, refuse links that leave the task, and refuse loops or cycles: the trees
    are not trivially equal."""
    seen: set[str] = set()
    for seed in range(30):
        differences, expected = compare(build_tree(random.Random(seed), tmp_path / str(seed)))
        assert differences == [], f"seed {seed}"
        for key, value in expected.items():
            if key.startswith("excluded") and value == ("ok", True):
                seen.add("excluded")
            if value[0] == "error":
                seen.add(value[2].split(":")[0])
    assert {"excluded", "Input paths must stay within the task"} <= seen, seen
    assert any("cycle" in s or "loop" in s.lower() for s in seen), seen


def test_a_wrong_fast_form_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a fast ``_matches`` that ignores ``.harborignore`` differs from Harbor's."""
    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(TASK_TOML.split("[[steps]]")[0])
    (task / "instruction.md").write_text("x")
    (task / "tests" / "test.sh").write_text("true")
    (task / "tests" / "notes.txt").write_text("x")
    (task / "tests" / ".harborignore").write_text("*.txt\n")
    assert compare(task)[0] == []
    matches = harbor_fastpaths.FASTPATHS[0]
    assert matches.name == "_matches"
    broken = harbor_fastpaths.FastPath(
        matches.module, matches.owner, matches.name, matches.source_sha256, lambda self, path: False
    )
    harbor_fastpaths.uninstall()
    monkeypatch.setattr(harbor_fastpaths, "FASTPATHS", (broken, *harbor_fastpaths.FASTPATHS[1:]))
    differences = compare(task)[0]
    assert any(line.startswith(f"excluded {task / 'tests' / 'notes.txt'}") for line in differences), differences
    harbor_fastpaths.uninstall()


def test_a_harbor_function_of_another_source_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Harbor whose function differs from the verified source keeps its own code."""
    harbor_fastpaths.uninstall()
    fast = harbor_fastpaths.FASTPATHS[0]
    stale = harbor_fastpaths.FastPath(fast.module, fast.owner, fast.name, "0" * 64, fast.replacement)
    monkeypatch.setattr(harbor_fastpaths, "FASTPATHS", (stale, *harbor_fastpaths.FASTPATHS[1:]))
    labels = harbor_fastpaths.install(settings.current())
    assert fast.label not in labels and len(labels) == len(harbor_fastpaths.FASTPATHS) - 1
    assert TaskFileFilter._matches is harbor_fastpaths.original(fast.label)
    harbor_fastpaths.uninstall()


def test_the_setting_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    harbor_fastpaths.uninstall()
    monkeypatch.setenv("OSMOSIS_HARBOR_HARBOR_FASTPATHS", "0")
    assert harbor_fastpaths.install(settings.current()) == ()
    assert TaskFileFilter.is_excluded is not harbor_fastpaths.is_excluded
    monkeypatch.delenv("OSMOSIS_HARBOR_HARBOR_FASTPATHS")
    harbor_fastpaths.install(settings.current())
    assert TaskFileFilter.is_excluded is harbor_fastpaths.is_excluded
