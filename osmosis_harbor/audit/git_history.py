"""History beyond HEAD in one repository copied out of a sandbox, read with dulwich on the host.

dulwich is pure Python and executes nothing a repository holds (no hooks, no fsmonitor, no
config-driven commands), unlike the host's ``git``, which this module never runs. Files that
would make dulwich read outside the copy (``objects/info/alternates``, ``commondir``) are
removed before the repository is opened.

A commit is *beyond HEAD* when HEAD does not reach it and its author or committer date is later
than HEAD's committer date. Each such commit is reported once, under the first holder in this
order: refs (branches, tags, remote-tracking refs, the stash, packed or loose), ``ORIG_HEAD``
and ``FETCH_HEAD``, the reflogs, then the object store (loose and packed objects nothing else
names). The walk is bounded by ``max_objects`` commits and objects and by a deadline; hitting
either is reported, never silent.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from dulwich.objects import Commit, Tag
from dulwich.reflog import read_reflog
from dulwich.repo import Repo
from pydantic import BaseModel

__all__ = ["BeyondHead", "HistoryScan", "scan_history"]

_HEX = re.compile(rb"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
_UNSAFE_FILES = ("objects/info/alternates", "objects/info/http-alternates", "commondir", "gitdir")
_SPECIAL_HEADS = ("ORIG_HEAD", "FETCH_HEAD")
_MAX_SMALL_FILE = 1 << 20  # ORIG_HEAD / FETCH_HEAD / a reflog larger than this is not read whole


class BeyondHead(BaseModel):
    """One holder of history beyond HEAD."""

    ref: str  # refs/heads/fix (packed), ORIG_HEAD, reflog logs/HEAD, objects
    commits: int
    newest_sha: str
    newest_date: str  # ISO 8601, UTC
    subject: str  # the newest commit's first line (sandbox-made: shown by the caller)
    read_with: str


class HistoryScan(BaseModel):
    """What one repository holds beyond HEAD, and where the scan stopped if it did."""

    head: str | None = None
    head_date: str | None = None
    beyond: list[BeyondHead] = []
    incomplete: str | None = None
    unreadable: bool = False  # not a git repository at all


class _Budget:
    def __init__(self, max_objects: int, deadline: float) -> None:
        self.left = max_objects
        self.deadline = deadline
        self.hit: str | None = None

    def spend(self) -> bool:
        if self.hit is not None:
            return False
        self.left -= 1
        if self.left < 0:
            self.hit = "the object bound (audit_max_objects)"
        elif time.monotonic() > self.deadline:
            self.hit = "the time bound (audit_timeout_sec)"
        return self.hit is None


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _commit(repo: Repo, sha: bytes, budget: _Budget) -> Commit | None:
    """The commit ``sha`` names, through annotated tags; None when it is missing or not a commit."""
    for _ in range(8):  # a tag of a tag of ...: bounded
        if not budget.spend():
            return None
        try:
            obj = repo.object_store[sha]  # type: ignore[index]  # dulwich's NewType over bytes
        except (KeyError, ValueError, OSError):
            return None
        if isinstance(obj, Commit):
            return obj
        if not isinstance(obj, Tag):
            return None
        sha = obj.object[1]
    return None


def _ancestors(repo: Repo, start: Commit, stop: set[bytes], budget: _Budget) -> Iterator[Commit]:
    """``start`` and the commits it reaches, not entering ``stop``."""
    pending = [start]
    seen: set[bytes] = set()
    while pending:
        commit = pending.pop()
        if commit.id in seen or commit.id in stop:
            continue
        seen.add(commit.id)
        yield commit
        for parent in commit.parents:
            if parent not in seen and parent not in stop:
                found = _commit(repo, parent, budget)
                if found is not None:
                    pending.append(found)


def _small_file(path: Path) -> bytes:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _MAX_SMALL_FILE:
            return b""
        return path.read_bytes()
    except OSError:
        return b""


def _holders(repo: Repo, git_dir: Path) -> Iterator[tuple[str, str, list[bytes]]]:
    """(holder, how an agent reads it, the shas it names), in the order the module describes."""
    try:
        packed = set(repo.refs.get_packed_refs())
        refs = repo.refs.as_dict()
    except Exception:  # a malformed ref store: the reflogs and objects are still read
        packed, refs = set(), {}
    for name in sorted(refs):
        if name == b"HEAD":
            continue
        ref = name.decode("utf-8", "replace")
        label = ref + (" (packed-refs)" if name in packed else "")
        read = "git stash list -p" if ref == "refs/stash" else f"git log --all  (or git show {ref})"
        yield label, read, [refs[name]]
    for special in _SPECIAL_HEADS:
        named = [line.split()[0] for line in _small_file(git_dir / special).splitlines() if line.split()]
        yield special, f"git show {special}", [s for s in named if _HEX.match(s)]
    logs = git_dir / "logs"
    for path in sorted(logs.rglob("*")) if logs.is_dir() else []:
        if path.is_symlink() or not path.is_file():
            continue
        data = _small_file(path)
        shas: list[bytes] = []
        try:
            for entry in read_reflog(io.BytesIO(data)):
                shas.extend([entry.new_sha, entry.old_sha])
        except Exception:
            continue
        log = path.relative_to(git_dir).as_posix()
        yield f"reflog {log}", "git reflog  (or git log -g --all)", [s for s in shas if _HEX.match(s)]
    # anything else the object store holds: loose objects and packs
    yield "objects (loose or packed)", "git fsck --lost-found; git show <sha>", list(_all_objects(repo))


def _all_objects(repo: Repo) -> Iterator[bytes]:
    try:
        yield from iter(repo.object_store)
    except Exception:
        return


def _neutralise(git_dir: Path) -> None:
    for name in _UNSAFE_FILES:
        target = git_dir / name
        if target.is_symlink() or target.is_file():
            target.unlink()


def scan_history(git_dir: Path, *, max_objects: int, timeout_sec: float) -> HistoryScan:
    """History beyond HEAD in the repository at ``git_dir`` (a ``.git`` directory or a bare
    repository, copied to the host)."""
    if not (git_dir / "HEAD").is_file() or not (git_dir / "objects").is_dir():
        return HistoryScan(incomplete="not readable as a git repository (no HEAD or objects/)", unreadable=True)
    _neutralise(git_dir)
    budget = _Budget(max_objects, time.monotonic() + timeout_sec)
    try:
        repo = Repo(str(git_dir), bare=True)
    except Exception as exc:
        return HistoryScan(incomplete=f"not readable as a git repository ({type(exc).__name__})", unreadable=True)
    with repo:
        try:
            head_sha = repo.refs[b"HEAD"]  # type: ignore[index]  # dulwich's NewType over bytes
        except (KeyError, ValueError):
            head_sha = None
        head = _commit(repo, head_sha, budget) if head_sha else None
        scan = HistoryScan()
        if head is None:
            return scan  # no commit yet: nothing is "beyond" it (objects would be the index's)
        scan.head, scan.head_date = head.id.decode(), _iso(head.commit_time)
        reachable = {c.id for c in _ancestors(repo, head, set(), budget)}
        reported: set[bytes] = set()
        for label, read_with, shas in _holders(repo, git_dir):
            later: list[Commit] = []
            for sha in shas:
                if sha in reachable or sha in reported:
                    continue
                start = _commit(repo, sha, budget)
                if start is None:
                    continue
                for commit in _ancestors(repo, start, reachable | reported, budget):
                    reported.add(commit.id)
                    if max(commit.commit_time, commit.author_time) > head.commit_time:
                        later.append(commit)
                if budget.hit:
                    break
            if later:
                newest = max(later, key=lambda c: max(c.commit_time, c.author_time))
                subject = newest.message.split(b"\n", 1)[0].decode("utf-8", "replace")
                scan.beyond.append(
                    BeyondHead(
                        ref=label,
                        commits=len(later),
                        newest_sha=newest.id.decode(),
                        newest_date=_iso(max(newest.commit_time, newest.author_time)),
                        subject=subject,
                        read_with=read_with.replace("<sha>", newest.id.decode()[:12]),
                    )
                )
            if budget.hit:
                scan.incomplete = f"stopped at {budget.hit}"
                break
        return scan
