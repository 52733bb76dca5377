"""Warm pools for the Docker sandbox emulation, plus the engine inventory they share with it.

Storage, chosen so that every process talking to the same engine sees the same pools:

* A pool spec is a Docker *volume* whose labels are the spec (image, cpus, memory, replicas,
  network, member TTL). Volumes are cheap (no process, no image), listable by label in one call,
  and untouched by ``docker container prune``. Labels are immutable, so a resize writes a new
  volume with a higher generation before removing the old one: readers take the highest
  generation and never see a gap.
* Pool members are containers labelled with the pool. An idle member is named
  ``ohpool_<pool>_<hex>``; claiming renames it to the sandbox name (the rename is what makes it
  claimed). Its labels still describe the process that created it, so the claim's mutable facts
  (owner, TTL, sandbox name) go on a per-claim volume ``ohclaim_<container id>``.

Listing and removing what the engine holds is ``inventory``; claiming a member is ``claims``.
Claims of one pool are serialised by a thread lock (same process) plus an ``flock`` on a file
under the cache dir (other processes on this machine); refills by a second such lock, so a
claim never waits behind a refill (``_refill_lock`` says why that is safe). Refill creates the
missing containers under its lock (creation is immediately visible to other refillers as
``created``) and starts them outside it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import docker.errors
from docker import APIClient

from osmosis_harbor.errors import (
    PoolExhaustedError,
    PoolExistsError,
    PoolNotFoundError,
)
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker.claims import (
    MemberLauncher,
    arm_ttl,
    claim_labels,
    cold_start,
    is_ready,
    is_starting,
    summarise,
    take_member,
)
from osmosis_harbor.sandbox.docker.inventory import (
    is_running,
    list_containers,
    remove_volume,
    removed_record,
    volumes,
)
from osmosis_harbor.sandbox.docker.labels import (
    ContainerInfo,
    Network,
    OwnerProcess,
    PoolInfo,
    PoolSpec,
    RemovedContainer,
    Role,
)
from osmosis_harbor.sandbox.docker.locks import pool_lock

log = logging.getLogger(__name__)

DEFAULT_MEMBER_TTL_SEC = 7 * 86_400
# Members about to expire are not handed out: the sandbox would die under the caller.
MIN_REMAINING_SEC = 5.0
POOL_READY_TIMEOUT_SEC = 180.0


class Launcher(MemberLauncher, Protocol):
    """The container primitives the pool layer borrows from the engine (``engine.Engine``)."""

    def ensure_image(self, image: str) -> None: ...

    def remove_container(self, container_id: str, *, wait: bool = False) -> bool: ...


class PoolManager:
    """Pool specs, claims and refills against one engine."""

    def __init__(
        self,
        api: APIClient,
        launcher: Launcher,
        submit: Callable[[Callable[[], Any]], Any],
        *,
        engine_key: str,
        lock_dir: Path,
    ) -> None:
        self._api = api
        self._launcher = launcher
        self._submit = submit
        self._engine_key = engine_key
        self._lock_dir = lock_dir
        # How long a member made from now on takes to count as ready (0 locally: a running
        # container is ready), stamped on it when it is made. The skypilot-emulator sets it to
        # stand in for a pod's scheduling and image pull.
        self.warm_sec = 0.0

    @contextmanager
    def _lock(self, pool: str) -> Iterator[None]:
        """Claims, shrinks and deletes: whatever takes or removes idle members."""
        with pool_lock(self._lock_dir, f"pool-{self._engine_key}-{pool}"):
            yield

    @contextmanager
    def _refill_lock(self, pool: str) -> Iterator[None]:
        """Refills: counting members and creating the missing ones. Apart from the claim lock,
        so a claim never waits behind a refill's container creations: a refill only removes
        dead members (never claimable), and a member claimed while it counts is made up by
        the refill that claim schedules. Shrinks and deletes take both (claim lock first)."""
        with pool_lock(self._lock_dir, f"pool-{self._engine_key}-{pool}-refill"):
            yield

    @contextmanager
    def _both_locks(self, pool: str) -> Iterator[None]:
        with self._lock(pool), self._refill_lock(pool):
            yield

    # spec storage ---------------------------------------------------------------------------

    def _spec_volumes(self, pool: str | None = None) -> dict[str, list[tuple[int, str, PoolSpec]]]:
        label = f"{L.POOL_SPEC}={pool}" if pool else L.POOL_SPEC
        by_pool: dict[str, list[tuple[int, str, PoolSpec]]] = {}
        for vol in volumes(self._api, label):
            try:
                spec = PoolSpec.from_labels(vol.get("Labels") or {})
            except (KeyError, ValueError):
                log.warning("ignoring malformed pool spec volume %s", vol.get("Name"))
                continue
            by_pool.setdefault(spec.name, []).append((spec.generation, vol["Name"], spec))
        for entries in by_pool.values():
            entries.sort(key=lambda e: e[0])
        return by_pool

    def spec_names(self) -> list[str]:
        return sorted(self._spec_volumes())

    def get_spec(self, pool: str) -> PoolSpec | None:
        entries = self._spec_volumes(pool).get(pool)
        return entries[-1][2] if entries else None

    def _write_spec(self, spec: PoolSpec) -> PoolSpec:
        """Create the next generation, then drop the older ones (caller holds the lock)."""
        old = self._spec_volumes(spec.name).get(spec.name, [])
        spec = spec.model_copy(update={"generation": (old[-1][0] + 1) if old else 0})
        name = f"{L.SPEC_VOLUME_PREFIX}{spec.name}_{spec.generation:08d}"
        self._api.create_volume(name=name, labels=spec.to_labels(OwnerProcess.current()))
        for _, vol_name, _ in old:
            remove_volume(self._api, vol_name)
        return spec

    # queries --------------------------------------------------------------------------------

    def _members(self, pool: str) -> list[ContainerInfo]:
        return list_containers(self._api, pool=pool)

    def get_pool(self, pool: str) -> PoolInfo:
        spec = self.get_spec(pool)
        if spec is None:
            raise PoolNotFoundError(f"no pool named {pool!r}")
        return summarise(spec, self._members(pool))

    def list_pools(self) -> list[PoolInfo]:
        specs = self._spec_volumes()
        members = [m for m in list_containers(self._api) if m.pool]
        return [
            summarise(entries[-1][2], [m for m in members if m.pool == name]) for name, entries in sorted(specs.items())
        ]

    # lifecycle ------------------------------------------------------------------------------

    def create_pool(
        self,
        name: str,
        image: str,
        *,
        cpus: float | None,
        memory_gb: float | None,
        replicas: int,
        member_ttl_sec: int,
        network: Network,
        wait: bool = True,
    ) -> PoolInfo:
        """Idempotent for an identical spec (re-running a prewarm is harmless). Returns once
        the members are ready, or at once with ``wait=False``."""
        L.validate_name(name, kind="pool")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self._launcher.ensure_image(image)
        wanted = PoolSpec(
            name=name,
            image=image,
            cpus=cpus,
            memory_gb=memory_gb,
            replicas=replicas,
            member_ttl_sec=member_ttl_sec,
            network=network,
            created_at=time.time(),
        )
        with self._both_locks(name):
            existing = self.get_spec(name)
            if existing is not None and not _same_shape(existing, wanted):
                raise PoolExistsError(
                    f"pool {name!r} exists with a different spec ({existing.image}, "
                    f"cpus={existing.cpus}, memory_gb={existing.memory_gb}, "
                    f"network={existing.network}); delete it first"
                )
            if existing is None or existing.replicas != replicas:
                base = existing or wanted
                self._write_spec(base.model_copy(update={"replicas": replicas}))
        self.refill(name)
        return self._wait_ready(name) if wait else self.get_pool(name)

    def set_pool_size(self, name: str, replicas: int, *, wait: bool = True) -> PoolInfo:
        """Grow (returns when the new members are ready, or at once with ``wait=False``);
        shrink by removing idle ones."""
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        with self._both_locks(name):
            spec = self.get_spec(name)
            if spec is None:
                raise PoolNotFoundError(f"no pool named {name!r}")
            self._write_spec(spec.model_copy(update={"replicas": replicas}))
            self._shrink_locked(name, replicas)
        self.refill(name)
        return self._wait_ready(name) if wait else self.get_pool(name)

    def delete_pool(self, name: str) -> list[RemovedContainer]:
        """Remove the spec and the idle members; claimed members stay with their sandboxes.

        Waits for a member another process is already removing (a reaper in a sibling process
        sees the spec gone first): the members it returns are gone, not going."""
        with self._both_locks(name):
            entries = self._spec_volumes(name).get(name, [])
            idle = [m for m in self._members(name) if m.is_idle_member]
            if not entries and not idle:
                raise PoolNotFoundError(f"no pool named {name!r}")
            for _, vol_name, _ in entries:
                remove_volume(self._api, vol_name)
            removed = []
            for member in idle:
                self._launcher.remove_container(member.id, wait=True)
                removed.append(removed_record(member, "pool deleted"))
        return removed

    def _shrink_locked(self, pool: str, replicas: int) -> None:
        at = time.time()
        idle = [m for m in self._members(pool) if m.is_idle_member]
        # Drop the least useful first: not yet running, then the oldest.
        idle.sort(key=lambda m: (is_running(m), m.created_at))
        usable = [m for m in idle if is_running(m) or is_starting(m, at)]
        stale = [m for m in idle if m not in usable]
        for member in stale + usable[: max(0, len(usable) - replicas)]:
            self._launcher.remove_container(member.id)

    def _wait_ready(self, name: str) -> PoolInfo:
        """Poll until the pool has its replicas idle (another process may still be starting some)."""
        deadline = time.monotonic() + POOL_READY_TIMEOUT_SEC
        delay = 0.05
        while True:
            info = self.get_pool(name)
            if info.idle >= info.replicas:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"pool {name!r} has {info.idle}/{info.replicas} idle members")
            if info.starting == 0:
                self.refill(name)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    # refill ---------------------------------------------------------------------------------

    def refill(self, pool: str) -> list[str]:
        """Top the pool up to its replica count; returns the ids of the members started."""
        with self._refill_lock(pool):
            spec = self.get_spec(pool)
            if spec is None:
                return []
            at = time.time()
            idle = [m for m in self._members(pool) if m.is_idle_member]
            ready = [m for m in idle if is_running(m) and not m.is_expired(at)]
            starting = [m for m in idle if is_starting(m, at)]
            for dead in (m for m in idle if m not in ready and m not in starting):
                self._launcher.remove_container(dead.id)
            deficit = spec.replicas - len(ready) - len(starting)
            created = [self._create_member(spec) for _ in range(max(0, deficit))]
        started = []
        for container_id in created:
            try:
                self._launcher.start_container(container_id)
                started.append(container_id)
            except docker.errors.NotFound:
                log.debug("pool %s member %s vanished before start (pool deleted?)", pool, container_id)
        return started

    def schedule_refill(self, pool: str) -> None:
        def run() -> None:
            try:
                self.refill(pool)
            except Exception:  # background: log, the next claim or get_pool retries
                log.exception("refilling pool %s failed", pool)

        self._submit(run)

    def _create_member(self, spec: PoolSpec) -> str:
        name = L.idle_member_name(spec.name, uuid.uuid4().hex[:10])
        at = time.time()
        labels = L.container_labels(
            sandbox=name,
            role=Role.POOL_MEMBER,
            owner=OwnerProcess.current(),
            created_at=at,
            ttl_sec=spec.member_ttl_sec,
            network=spec.network,
            pool=spec.name,
            extra={L.READY_AT: L.fmt_time(at + self.warm_sec)} if self.warm_sec else None,
        )
        return self._launcher.create_container(
            name=name,
            image=spec.image,
            cpus=spec.cpus,
            memory_gb=spec.memory_gb,
            network=spec.network,
            ttl_sec=spec.member_ttl_sec,
            labels=labels,
        )

    # claims (see claims.py) ------------------------------------------------------------------

    def claim(
        self,
        pool: str,
        *,
        name: str,
        ttl_sec: int,
        owner: OwnerProcess,
        extra: dict[str, str],
        network: Network | None = None,
        start_if_empty: bool = True,
    ) -> tuple[str, PoolSpec]:
        """Hand a ready member to sandbox *name*; when there is none, cold-start one, or with
        ``start_if_empty=False`` raise `PoolExhaustedError` (what SkyPilot's pools do).

        *network*, when given, must be the pool's network (members cannot change it).
        Returns the container id and the pool spec (the sandbox's image comes from it).
        """
        spec = self.get_spec(pool)
        if spec is None:
            raise PoolNotFoundError(f"no pool named {pool!r}")
        if network is not None and network != spec.network:
            raise ValueError(
                f"pool {pool!r} members use the {spec.network!r} network, not {network!r}: "
                "create the pool with the network option instead"
            )
        with self._lock(pool):
            member = self._claim_idle_locked(pool, name=name, ttl_sec=ttl_sec, owner=owner, extra=extra)
        self.schedule_refill(pool)
        if member is None and not start_if_empty:
            raise PoolExhaustedError(f"pool {pool!r} has no ready member to claim (it is empty or still warming)")
        if member is None:
            log.info("pool %s has no idle member; cold-starting sandbox %s", pool, name)
            return cold_start(self._launcher, spec, name=name, ttl_sec=ttl_sec, owner=owner, extra=extra), spec
        # The TTL timer is a detached exec: armed off the claim's path (two engine calls a
        # caller would otherwise wait for); until it runs, the member's own TTL and reap() hold.
        self._submit(lambda: arm_ttl(self._api, member, ttl_sec))
        return member.id, spec

    def _claim_idle_locked(
        self, pool: str, *, name: str, ttl_sec: int, owner: OwnerProcess, extra: dict[str, str]
    ) -> ContainerInfo | None:
        """Rename the idle member with the most life left; the rename is the claim."""
        at = time.time()
        candidates = [
            m
            for m in self._members(pool)
            if is_ready(m, at) and (m.expires_at or float("inf")) - at > MIN_REMAINING_SEC
        ]
        # Most remaining life first: the claimed sandbox lives min(member TTL, claim TTL).
        candidates.sort(key=lambda m: m.expires_at or float("inf"), reverse=True)
        for member in candidates:
            if take_member(self._api, member, name, claim_labels(member, name, ttl_sec, owner, extra)):
                return member
        return None


def _same_shape(a: PoolSpec, b: PoolSpec) -> bool:
    return (a.image, a.cpus, a.memory_gb, a.network, a.member_ttl_sec) == (
        b.image,
        b.cpus,
        b.memory_gb,
        b.network,
        b.member_ttl_sec,
    )
