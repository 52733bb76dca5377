"""The ledger's per-thread connections (``sandbox/ledger/store.py``): rows written from several
threads of one process all land; a forked child does not reuse its parent's connection; and
a row committed just before its writer was SIGKILLed is there for the next reader, while the
transaction the kill interrupted is not (the kill really landed mid-write: the control)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox.ledger.store import Kind, Ledger, State


def test_rows_from_several_threads_each_on_its_own_connection(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    owner = OwnerProcess.current()
    connections: list[sqlite3.Connection] = []  # held, so no id is reused by a later one
    guard = threading.Lock()

    def write(thread: int) -> None:
        for i in range(25):
            name = f"t{thread}-{i}"
            ledger.record(Kind.SANDBOX, "docker", "e", name, owner)
            ledger.mark(Kind.SANDBOX, "docker", "e", name, State.RUNNING)
            if i % 5 == 0:
                ledger.forget(Kind.SANDBOX, "docker", "e", name)
        with guard:
            connections.append(ledger._connection())

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = ledger.entries(sdk="docker")
    assert len(entries) == 4 * 20 and all(e.state is State.RUNNING for e in entries)
    assert len({id(c) for c in connections}) == 4
    # another process's view of the file: the same rows, committed
    assert len(Ledger(tmp_path / "ledger.sqlite3").entries()) == 80


def _forked_writer(ledger: Ledger, parent_connection: int, out: Connection) -> None:
    ledger.record(Kind.SANDBOX, "docker", "e", "from-child", OwnerProcess.current())
    out.send(id(ledger._connection()) != parent_connection)


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.record(Kind.SANDBOX, "docker", "e", "from-parent", OwnerProcess.current())
    reader, writer = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_forked_writer, args=(ledger, id(ledger._connection()), writer)
    )
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0 and reader.recv() is True
    assert {e.name for e in ledger.entries()} == {"from-parent", "from-child"}


def _write_then_hang(path: str, out: Connection) -> None:
    ledger = Ledger(Path(path))
    ledger.record(Kind.SANDBOX, "docker", "e", "committed", OwnerProcess.current())
    db = sqlite3.connect(path)  # a second writer, left mid-transaction
    db.execute("BEGIN IMMEDIATE")
    db.execute(
        "INSERT INTO things VALUES ('sandbox', 'docker', 'e', 'uncommitted', 'h', 1, NULL, 0, 'creating', 0, NULL)"
    )
    out.send(os.getpid())
    threading.Event().wait()  # until killed


def test_a_commit_survives_a_kill_9_of_its_writer(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    Ledger(path)
    reader, writer = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_write_then_hang, args=(str(path), writer))
    child.start()
    try:
        assert reader.poll(60)
        pid = reader.recv()
        os.kill(pid, signal.SIGKILL)
    finally:
        child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    entries = Ledger(path).entries()
    assert [e.name for e in entries] == ["committed"]  # the interrupted insert is not there
    assert entries[0].owner.is_dead()
