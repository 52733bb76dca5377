"""Cleaning up what crashes, TTLs and tests leave behind on the Docker engine.

All sandbox state lives in the engine, so nothing is lost when a process dies, but nothing is
freed either: a container whose owner crashed keeps running until its TTL, a stopped one keeps
its name, a claim volume outlives its container. This module decides what is stale
(`stale_reason`), removes it (`reap`, run by hand or in the background at most once a minute),
and removes everything on request (`remove_all`). It works on whatever engine wrapper it is
given (``ReapEngine``), so it does not import ``engine`` (which calls into it).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import docker.errors
from docker import APIClient

from osmosis_harbor.sandbox.docker import inventory
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker.inventory import list_containers, removed_record
from osmosis_harbor.sandbox.docker.labels import ContainerInfo, OwnerProcess, RemovedContainer
from osmosis_harbor.sandbox.docker.pools import PoolManager


class ReapEngine(Protocol):
    """What reaping needs of the engine (``engine.Engine`` calls into this module)."""

    @property
    def api(self) -> APIClient: ...

    @property
    def pools(self) -> PoolManager: ...

    def remove_container(self, container_id: str, *, wait: bool = False) -> bool: ...


log = logging.getLogger(__name__)

# A sandbox stuck in "created" this long lost the process that was starting it.
STALE_CREATED_SEC = 120.0


def stale_reason(info: ContainerInfo, at: float, *, dead_owners: bool, expired: bool = True) -> str | None:
    """Why *info* should be reaped, or None. Idle pool members never die with their creator."""
    created_long_ago = at - info.created_at > STALE_CREATED_SEC
    if expired and info.is_expired(at):
        return "expired"
    if expired and info.state in ("exited", "dead"):
        return "stopped"
    if expired and info.state == "created" and created_long_ago:
        return "never started"
    if info.is_idle_member or not dead_owners:
        return None
    owner = info.owner
    if owner is not None and owner.is_dead():
        return f"owner pid {owner.pid} is dead"
    return None


_reap_lock = threading.Lock()
_auto_reap_enabled = True


@contextmanager
def pause_auto_reap() -> Iterator[None]:
    """Stop the background reap (and wait for one in flight): for tests of `reap()` itself."""
    global _auto_reap_enabled
    previous, _auto_reap_enabled = _auto_reap_enabled, False
    with _reap_lock:
        pass
    try:
        yield
    finally:
        _auto_reap_enabled = previous


def disable_auto_reap() -> None:
    """Stop this process's background reap for good: for a process serving one account on a
    shared engine (the skypilot-emulator's server), which removes only its own sandboxes and
    must not reap the engine's other users' expired or orphaned containers."""
    global _auto_reap_enabled
    _auto_reap_enabled = False


def auto_reap_enabled() -> bool:
    """False inside `pause_auto_reap`."""
    return _auto_reap_enabled


def background_reap(engine: ReapEngine) -> None:
    """One background pass (submitted by ``ReapEngine.maybe_auto_reap``); never raises."""
    try:
        with _reap_lock:
            if _auto_reap_enabled:
                _reap_locked(engine, expired=True, dead_owners=True)
    except Exception:
        log.exception("background reap failed")


def reap(engine: ReapEngine, *, expired: bool, dead_owners: bool) -> list[RemovedContainer]:
    """`_reap_locked` under the lock the background reap takes (never two passes at once).
    What it returns is gone: a removal a sibling process's reaper already has in progress is
    waited for, not counted as done."""
    with _reap_lock:
        return _reap_locked(engine, expired=expired, dead_owners=dead_owners)


def _reap_locked(engine: ReapEngine, *, expired: bool, dead_owners: bool) -> list[RemovedContainer]:
    at = time.time()
    infos = list_containers(engine.api)
    # Specs listed after containers: a member listed above whose pool is missing here is an
    # orphan, while members of a pool created meanwhile are not in `infos` at all.
    pools = set(engine.pools.spec_names())
    removed: list[RemovedContainer] = []
    for info in infos:
        reason = stale_reason(info, at, dead_owners=dead_owners, expired=expired)
        if reason is None and expired and info.is_idle_member and info.pool not in pools:
            reason = "pool deleted"
        if reason is not None and engine.remove_container(info.id, wait=True):
            removed.append(removed_record(info, reason))
    _remove_orphan_claims(engine, {i.id for i in infos})
    remove_dangling_tmp_volumes(engine)
    return removed


def remove_dangling_tmp_volumes(engine: ReapEngine) -> None:
    """Sandbox /tmp volumes whose container was removed without them (``docker rm -f`` without
    ``-v``, an eviction): each holds nothing once dangling, but they pile up in the engine. The
    engine refuses to remove a volume a container still uses (409), which is left as it is."""
    for name in inventory.dangling_tmp_volumes(engine.api):
        try:
            engine.api.remove_volume(name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # in use again, or busy: the next pass sees it
            log.debug("sandbox /tmp volume %s not removed: %s", name, exc)


def _remove_orphan_claims(engine: ReapEngine, live_ids: set[str]) -> None:
    """Claims of containers that vanished (TTL auto-remove, crash) are dead weight."""
    for container_id in inventory.list_claims(engine.api):
        if container_id not in live_ids:
            inventory.remove_volume(engine.api, inventory.claim_volume_name(container_id))


def remove_all(engine: ReapEngine, owner_pid: int | None) -> list[RemovedContainer]:
    """The body of the facade's ``remove_all``: every managed container, or *owner_pid*'s."""
    host = socket.gethostname()
    removed: list[RemovedContainer] = []
    infos = list_containers(engine.api)
    for info in infos:
        owner = info.owner
        if owner_pid is not None and (owner is None or owner.pid != owner_pid or owner.host != host):
            continue
        if engine.remove_container(info.id, wait=True):
            removed.append(removed_record(info, "remove_all"))
    _remove_pool_specs(engine, owner_pid, host)
    _remove_orphan_claims(engine, {i.id for i in infos} - {r.container_id for r in removed})
    remove_dangling_tmp_volumes(engine)
    return removed


def _remove_pool_specs(engine: ReapEngine, owner_pid: int | None, host: str) -> None:
    volumes = engine.api.volumes(filters={"label": [L.MANAGED_FILTER, L.POOL_SPEC]}).get("Volumes") or []
    for vol in volumes:
        owner = OwnerProcess.from_labels(vol.get("Labels") or {})
        if owner_pid is None or (owner is not None and owner.pid == owner_pid and owner.host == host):
            inventory.remove_volume(engine.api, vol["Name"])
