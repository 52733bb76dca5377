"""A crash-safe record of every sandbox and pool this host creates, shared by its processes.

On SkyPilot a sandbox nobody remembers is a pod that bills until its TTL: a host killed with
SIGKILL remembers nothing, and a terminate that failed is easily forgotten. So a row is
written *before* each create call (the SDK and its endpoint, the name, the owner process, when,
the state) and removed only once the SDK said the thing is gone. Whatever a dead owner left is
then known to the next start and to ``cleanup``, which cross-check it with the SDK's ``ls``
(``sandbox/ledger/leftovers.py``). SQLite from the standard library, in WAL mode, so several processes
(servers, ``validate``, ``cleanup``) read and write one file safely.

Cost: the ledger is written three times per sandbox (record, mark, forget), so a graded
rollout makes six writes. Each thread keeps one connection (opening one per call cost more
than the write), and commits with ``synchronous=NORMAL``: in WAL mode a commit then appends
its frames to the WAL without an fsync, and the WAL is synced at each checkpoint. What the
ledger protects against is a host *process* killed outright (SIGKILL, OOM, a crash): the
frames a committed transaction wrote are in the OS page cache the moment ``commit`` returns,
so they survive the process and the next reader sees them, exactly as with ``FULL``. What
``NORMAL`` gives up is the OS crash or power loss: the commits since the last checkpoint may
then be lost (the file is never corrupted), and a sandbox created in that window is unknown to
the ledger, so on SkyPilot it bills until its TTL (on Docker its owner labels still find it).
So a row is still written before each create call, and still there after a kill -9 of its
owner (``tests/e2e/sandbox/test_ledger_lifecycle.py``, ``tests/e2e/sandbox/test_ledger_serving.py``,
``tests/unit/sandbox/test_ledger_connections.py``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from osmosis_harbor import settings
from osmosis_harbor.owner_process import OwnerProcess

__all__ = ["Kind", "Ledger", "LedgerEntry", "PoolUser", "State", "default_ledger", "endpoint_for"]

BUSY_TIMEOUT_SEC = 30.0

# A connection must not cross a fork (SQLite's rule). One a child inherits is kept here, never
# used nor closed: closing it could act on the parent's locks and WAL.
_INHERITED: list[sqlite3.Connection] = []

_SCHEMA = """
CREATE TABLE IF NOT EXISTS things (
    kind TEXT NOT NULL,
    sdk TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    name TEXT NOT NULL,
    owner_host TEXT NOT NULL,
    owner_pid INTEGER NOT NULL,
    owner_start TEXT,
    created_at REAL NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    PRIMARY KEY (kind, sdk, endpoint, name)
);
CREATE TABLE IF NOT EXISTS pool_users (
    sdk TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    pool TEXT NOT NULL,
    user TEXT NOT NULL,
    owner_host TEXT NOT NULL,
    owner_pid INTEGER NOT NULL,
    owner_start TEXT,
    PRIMARY KEY (sdk, endpoint, pool, user)
)
"""


class Kind(StrEnum):
    SANDBOX = "sandbox"
    POOL = "pool"


class State(StrEnum):
    CREATING = "creating"  # written before the create call: it may or may not have happened
    RUNNING = "running"
    TERMINATE_FAILED = "terminate_failed"  # retried in the background and by the shutdown sweep
    DELETE_FAILED = "delete_failed"  # a pool its owner could not delete: the next start or cleanup does
    HANDED_OVER = "handed_over"  # a pool prewarm left to the user: no reaper touches it, cleanup --pool does


class LedgerEntry(BaseModel):
    """One sandbox or pool the ledger says may still exist."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    sdk: str
    endpoint: str
    name: str
    owner: OwnerProcess
    created_at: float
    state: State
    attempts: int = 0
    last_error: str | None = None


class PoolUser(BaseModel):
    """One owner (``user``: its id, unique per backend or run) using a pool, and its process."""

    model_config = ConfigDict(frozen=True)

    user: str
    owner: OwnerProcess


class Ledger:
    """The ledger file at ``path`` (created on first use, with its directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection (made on first use, and again in a forked child)."""
        local = self._local
        db: sqlite3.Connection | None = getattr(local, "db", None)
        if db is not None and local.pid == os.getpid():
            return db
        if db is not None:
            _INHERITED.append(db)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SEC)
        db.execute("PRAGMA synchronous=NORMAL")  # per connection; see the module docstring
        local.db, local.pid = db, os.getpid()
        return db

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, in one transaction committed on success (a short write
        each), rolled back on an error."""
        db = self._connection()
        with db:
            yield db

    def record(self, kind: Kind, sdk: str, endpoint: str, name: str, owner: OwnerProcess) -> None:
        """Before the create call: this owner is about to make ``name`` (replaces an old row)."""
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO things VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, NULL)",
                (kind, sdk, endpoint, name, owner.host, owner.pid, owner.start, time.time(), State.CREATING),
            )

    def mark(self, kind: Kind, sdk: str, endpoint: str, name: str, state: State, error: str | None = None) -> None:
        """A new state; a failed terminate or delete also counts an attempt and keeps its error."""
        bump = 1 if state in (State.TERMINATE_FAILED, State.DELETE_FAILED) else 0
        with self._connect() as db:
            db.execute(
                "UPDATE things SET state = ?, attempts = attempts + ?, last_error = COALESCE(?, last_error) "
                "WHERE kind = ? AND sdk = ? AND endpoint = ? AND name = ?",
                (state, bump, error, kind, sdk, endpoint, name),
            )

    def forget(self, kind: Kind, sdk: str, endpoint: str, name: str) -> None:
        """The SDK said it is gone (or it never came to be)."""
        with self._connect() as db:
            db.execute(
                "DELETE FROM things WHERE kind = ? AND sdk = ? AND endpoint = ? AND name = ?",
                (kind, sdk, endpoint, name),
            )

    # ── who uses a pool: pool names are shared warm capacity, so a pool has many users ──────
    def use_pool(self, sdk: str, endpoint: str, pool: str, user: str, owner: OwnerProcess) -> None:
        """``user`` (an owner of process ``owner``) uses ``pool``: no other owner's shutdown
        deletes it while ``user`` is alive and has not released it."""
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO pool_users VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sdk, endpoint, pool, user, owner.host, owner.pid, owner.start),
            )

    def release_pool(self, sdk: str, endpoint: str, pool: str, user: str) -> None:
        with self._connect() as db:
            db.execute(
                "DELETE FROM pool_users WHERE sdk = ? AND endpoint = ? AND pool = ? AND user = ?",
                (sdk, endpoint, pool, user),
            )

    def pool_users(self, sdk: str, endpoint: str, pool: str) -> list[PoolUser]:
        """The owners using ``pool``, dead processes' included (``OwnerProcess.is_dead`` tells)."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT user, owner_host, owner_pid, owner_start FROM pool_users "
                "WHERE sdk = ? AND endpoint = ? AND pool = ? ORDER BY user",
                (sdk, endpoint, pool),
            ).fetchall()
        return [
            PoolUser(user=user, owner=OwnerProcess(host=host, pid=pid, start=start)) for user, host, pid, start in rows
        ]

    def live_pool_users(self, sdk: str, endpoint: str, pool: str, *, besides: str | None = None) -> list[PoolUser]:
        """The users of ``pool`` other than ``besides`` whose process lives; a dead process's
        use does not count, and its row goes."""
        live = []
        for use in self.pool_users(sdk, endpoint, pool):
            if use.user == besides:
                continue
            if use.owner.is_dead():
                self.release_pool(sdk, endpoint, pool, use.user)
            else:
                live.append(use)
        return live

    def entries(self, sdk: str | None = None, endpoint: str | None = None) -> list[LedgerEntry]:
        """Every row, or those of one SDK (and endpoint), oldest first."""
        query, args = "SELECT * FROM things", []
        clauses = [(c, v) for c, v in (("sdk", sdk), ("endpoint", endpoint)) if v is not None]
        if clauses:
            query += " WHERE " + " AND ".join(f"{c} = ?" for c, _ in clauses)
            args = [v for _, v in clauses]
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY created_at", args).fetchall()
        return [_entry(row) for row in rows]


def _entry(row: tuple[object, ...]) -> LedgerEntry:
    kind, sdk, endpoint, name, host, pid, start, created_at, state, attempts, last_error = row
    return LedgerEntry.model_validate(
        {
            "kind": kind,
            "sdk": sdk,
            "endpoint": endpoint,
            "name": name,
            "owner": {"host": host, "pid": pid, "start": start},
            "created_at": created_at,
            "state": state,
            "attempts": attempts,
            "last_error": last_error,
        }
    )


def default_ledger(current: settings.Settings) -> Ledger:
    """The ledger ``current`` names: ``Settings.ledger`` (``OSMOSIS_HARBOR_LEDGER``), else under
    the cache dir."""
    return Ledger(current.ledger_path())


def endpoint_for(sdk: str, current: settings.Settings) -> str:
    """Which service of ``sdk`` a name belongs to by ``current`` (the same name on two services is
    two things)."""
    if sdk == "docker":
        return current.docker_host
    if sdk == "skypilot-emulator":
        return current.emulator_url or "on-demand"
    return current.skypilot_api_server_endpoint or "default"
