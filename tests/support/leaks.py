"""Which sandbox containers a test session left behind (the conftest's session check).

Why its own module: the rule has two owners to tell apart, and a test proves it does not
misfire. A Docker-SDK sandbox is owned by a host process (this one, or a CLI subprocess that
has exited since). A skypilot-emulator sandbox is owned by its server, not by any client
process (its owner host is ``EMULATOR_OWNER_HOST``): it is this session's when one of the
servers this session started made it, whether that server still runs or not. Another test
session's sandboxes on the same shared engine (a live process, or an emulator server this
session did not start) are never counted. Idle pool members belong to their pool; a pool (its
spec volume) is judged by its owner too, more strictly (``session_pools``), and a leaked pool's
members go with it.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import docker

from osmosis_harbor import settings
from osmosis_harbor.owner_process import OWNER_HOST, OWNER_PID
from osmosis_harbor.sandbox.docker.labels import CREATED_AT, IDLE_PREFIX, POOL, POOL_SPEC
from osmosis_harbor.sandbox.emulator.server.state import EMULATOR_OWNER_HOST
from tests.support.common import process_alive


def is_leak(
    labels: dict[str, str],
    name: str,
    started: float,
    emulator_servers: Collection[int],
    own_pids: Collection[int] = (),
) -> bool:
    """A container made since ``started`` that this session should have removed. ``own_pids``:
    the session's own processes besides this one (its xdist workers, seen from the controller)."""
    created = float(labels.get(CREATED_AT) or 0)
    if created < started or name.startswith(IDLE_PREFIX):
        return False
    pid = int(labels.get(OWNER_PID) or 0)
    if labels.get(OWNER_HOST) == EMULATOR_OWNER_HOST:
        return pid in emulator_servers
    return pid == os.getpid() or pid in own_pids or not process_alive(pid)


def session_pools(
    started: float,
    emulator_servers: Collection[int],
    own_pids: Collection[int] = (),
    ledgers: Collection[Path] | None = None,
) -> list[str]:
    """Warm pools this session made and did not delete, judged by their spec volume's owner (the
    process that wrote it: an emulator server writes its account's). Stricter than a container's
    rule: an owner that has exited counts only when this session's ledger still names the pool
    (a CLI run of this session made it and neither deleted nor handed it over); another
    session's exited owner (its stopped emulator server, its CLI) is not this session's to delete.
    ``ledgers``: the session's ledgers (its xdist workers' own), else the default one."""
    from osmosis_harbor.sandbox.ledger.store import Kind, Ledger, default_ledger

    books = [Ledger(path) for path in ledgers] if ledgers is not None else [default_ledger(settings.current())]
    ledgered = {entry.name for book in books for entry in book.entries() if entry.kind is Kind.POOL}
    client = docker.from_env()
    volumes: list[dict[str, Any]] = client.api.volumes(filters={"label": POOL_SPEC})["Volumes"] or []
    found = set()
    for volume in volumes:
        labels = volume.get("Labels") or {}
        name, pid = labels[POOL_SPEC], int(labels.get(OWNER_PID) or 0)
        if float(labels.get(CREATED_AT) or 0) < started:
            continue
        ours = pid == os.getpid() or pid in own_pids or pid in emulator_servers
        if ours or (name in ledgered and not process_alive(pid)):
            found.add(name)
    return sorted(found)


def session_leaks(
    started: float,
    emulator_servers: Collection[int],
    leaked_pools: Collection[str] = (),
    own_pids: Collection[int] = (),
) -> list[tuple[str, str]]:
    """(id, name) of every container :func:`is_leak` counts, on the local engine; idle members of
    ``leaked_pools`` go with their pool."""
    client = docker.from_env()
    containers: list[dict[str, Any]] = client.api.containers(all=True, filters={"label": "osmosis-harbor.managed=1"})
    found = []
    for c in containers:
        labels, name = c.get("Labels") or {}, c["Names"][0].lstrip("/")
        in_leaked_pool = name.startswith(IDLE_PREFIX) and labels.get(POOL) in leaked_pools
        if in_leaked_pool or is_leak(labels, name, started, emulator_servers, own_pids):
            found.append((c["Id"], name))
    return found
