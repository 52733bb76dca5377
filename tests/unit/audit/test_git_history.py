"""The history half of the leak audit on repositories this test makes with git (trusted: its
own), read by ``scan_history`` as the audit reads a copy from a sandbox: every holder of history
beyond HEAD the image-based tests do not cover (the stash, ``ORIG_HEAD``, ``FETCH_HEAD``, an
object nothing names), the date rule (an older unreachable commit is no leak), an alternates
file that would make the reader look outside the copy, and the object bound."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from osmosis_harbor.audit.git_history import scan_history

BEFORE, AFTER = "2024-01-01T00:00:00Z", "2024-06-01T00:00:00Z"


def git(repo: Path, *args: str, date: str = BEFORE) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "a.txt").write_text("base\n")
    git(path, "add", "a.txt")
    git(path, "commit", "-q", "-m", "base")
    return path


def _commit_later(repo: Path, message: str) -> str:
    (repo / "a.txt").write_text(f"{message}\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", message, date=AFTER)
    return git(repo, "rev-parse", "HEAD")


def holders(repo: Path, **bounds: int) -> list[tuple[str, str]]:
    scan = scan_history(repo / ".git", max_objects=bounds.get("max_objects", 10_000), timeout_sec=30)
    return [(b.ref, b.subject) for b in scan.beyond] + ([("incomplete", scan.incomplete)] if scan.incomplete else [])


def test_the_stash_holds_later_work(repo: Path) -> None:
    (repo / "a.txt").write_text("stashed fix\n")
    git(repo, "stash", "-q", date=AFTER)
    assert holders(repo)[0] == ("refs/stash", "WIP on main: " + git(repo, "log", "-1", "--format=%h %s", "main"))


def test_orig_head_and_fetch_head_without_reflogs(repo: Path) -> None:
    fix = _commit_later(repo, "the fix")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    assert holders(repo) == [("ORIG_HEAD", "the fix")]
    (repo / ".git" / "ORIG_HEAD").unlink()
    (repo / ".git" / "FETCH_HEAD").write_text(f"{fix}\t\tbranch 'fix' of https://example.invalid/r\n")
    assert holders(repo) == [("FETCH_HEAD", "the fix")]
    (repo / ".git" / "FETCH_HEAD").unlink()
    # nothing names it any more: the object store still holds it
    assert holders(repo) == [("objects (loose or packed)", "the fix")]
    git(repo, "gc", "-q", "--prune=now")  # what the advice says: then nothing is left
    assert holders(repo) == []


def test_an_older_unreachable_commit_is_no_leak_and_alternates_are_not_followed(repo: Path, tmp_path: Path) -> None:
    git(repo, "checkout", "-q", "-b", "abandoned")
    (repo / "a.txt").write_text("an idea dropped before HEAD\n")
    git(repo, "commit", "-q", "-am", "older", date="2023-06-01T00:00:00Z")
    git(repo, "checkout", "-q", "main")
    assert holders(repo) == []
    # an alternates file naming another repository's objects (on the host, for a copy) is removed
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    alternates = repo / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    alternates.write_text(f"{other / '.git' / 'objects'}\n")
    scan_history(repo / ".git", max_objects=10_000, timeout_sec=30)
    assert not alternates.exists()


def test_the_object_bound_is_reported(repo: Path) -> None:
    for i in range(5):
        _commit_later(repo, f"later {i}")
    git(repo, "reset", "-q", "--hard", "HEAD~5")
    scan = scan_history(repo / ".git", max_objects=10_000, timeout_sec=30)
    assert [(b.ref, b.commits) for b in scan.beyond] == [("ORIG_HEAD", 5)] and scan.incomplete is None
    # cut short: what was read is still reported, and so is where the scan stopped
    bounded = scan_history(repo / ".git", max_objects=3, timeout_sec=30)
    assert [b.commits for b in bounded.beyond] < [5]
    assert bounded.incomplete == "stopped at the object bound (audit_max_objects)"


def test_a_directory_that_is_no_repository_is_said_so(tmp_path: Path) -> None:
    (tmp_path / "vendor.git").mkdir()
    (tmp_path / "vendor.git" / "README").write_text("not a repository\n")
    scan = scan_history(tmp_path / "vendor.git", max_objects=100, timeout_sec=5)
    assert scan.unreadable and scan.beyond == [] and "not readable as a git repository" in (scan.incomplete or "")
