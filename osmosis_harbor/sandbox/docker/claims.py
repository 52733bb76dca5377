"""Claiming a pool member for a sandbox: which members are ready, the rename that is the claim,
its labels, its TTL.

An idle member is named ``ohpool_<pool>_<hex>``; claiming renames it to the sandbox name. Its
own labels still describe the process that created it, so the claim's mutable facts (owner,
TTL, sandbox name) go on a per-claim volume named after the container. When the pool is
empty, a member is cold-started straight under the sandbox name.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import docker.errors
from docker import APIClient

from osmosis_harbor.errors import SandboxExistsError
from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker.inventory import claim_volume_name, is_running, remove_volume
from osmosis_harbor.sandbox.docker.labels import ContainerInfo, Network, PoolInfo, PoolSpec, Role

__all__ = [
    "MemberLauncher",
    "arm_ttl",
    "claim_labels",
    "cold_start",
    "is_ready",
    "is_starting",
    "summarise",
    "take_member",
]

log = logging.getLogger(__name__)

# A member stuck in "created" this long lost its starter (crashed process): not "starting".
STALE_CREATED_SEC = 120.0


def is_starting(member: ContainerInfo, at: float) -> bool:
    return member.state == "created" and at - member.created_at < STALE_CREATED_SEC


def is_ready(member: ContainerInfo, at: float) -> bool:
    """Claimable: idle, running, and warm (past the ready time it was made with)."""
    return member.is_idle_member and is_running(member) and at >= member.ready_at


def summarise(spec: PoolSpec, members: list[ContainerInfo]) -> PoolInfo:
    """The pool as a caller sees it: ready (``idle``), starting (or still warming) and claimed."""
    at = time.time()
    idle = [m for m in members if m.is_idle_member]
    live = [m for m in idle if is_running(m) and not m.is_expired(at)]
    ready = [m for m in live if is_ready(m, at)]
    return PoolInfo(
        spec=spec,
        idle=len(ready),
        starting=sum(1 for m in idle if is_starting(m, at)) + len(live) - len(ready),
        claimed=sum(1 for m in members if not m.is_idle_member and is_running(m)),
    )


class MemberLauncher(Protocol):
    """The container primitives a cold start needs (``engine.Engine``)."""

    def create_container(
        self,
        *,
        name: str,
        image: str,
        cpus: float | None,
        memory_gb: float | None,
        network: Network,
        ttl_sec: int,
        labels: dict[str, str],
        env: dict[str, str] | None = None,
    ) -> str: ...

    def start_container(self, container_id: str) -> None: ...


def take_member(api: APIClient, member: ContainerInfo, name: str, labels: dict[str, str]) -> bool:
    """Rename ``member`` to ``name`` (the claim), recording ``labels`` on its claim volume.
    False when the member vanished meanwhile."""
    volume = claim_volume_name(member.id)
    api.create_volume(name=volume, labels=labels)
    try:
        api.rename(member.id, name)
    except docker.errors.NotFound:
        remove_volume(api, volume)
        return False
    except docker.errors.APIError as exc:
        remove_volume(api, volume)
        if exc.status_code == 409:
            raise SandboxExistsError(f"a sandbox named {name!r} already exists") from exc
        raise
    return True


def claim_labels(
    member: ContainerInfo, name: str, ttl_sec: int, owner: OwnerProcess, extra: dict[str, str]
) -> dict[str, str]:
    at = time.time()
    labels = {
        L.MANAGED: "1",
        L.CLAIM_OF: member.id,
        L.SANDBOX: name,
        L.POOL: member.pool or "",
        L.CREATED_AT: L.fmt_time(at),
        L.TTL_SEC: str(ttl_sec),
        L.EXPIRES_AT: L.fmt_time(at + ttl_sec),
        **owner.labels(),
    }
    labels.update({k: v for k, v in extra.items() if v})
    return labels


def arm_ttl(api: APIClient, member: ContainerInfo, ttl_sec: int) -> None:
    """Enforce the claim's TTL inside the container, like a fresh sandbox's ``sleep <ttl>``.

    The member's own main process already sleeps for the member TTL; when the claim ends
    sooner, a detached exec signals PID 1 (the init), which stops the container. Needs
    ``sh`` in the image; without it the host-side ``reap()`` still enforces the expiry.
    """
    remaining = (member.expires_at or float("inf")) - time.time()
    if remaining <= ttl_sec:
        return
    try:
        exec_id = api.exec_create(
            member.id, ["sh", "-c", f"sleep {int(ttl_sec)} && kill -TERM 1"], stdout=False, stderr=False
        )["Id"]
        api.exec_start(exec_id, detach=True)
    except docker.errors.APIError as exc:
        if exc.status_code in (404, 409):  # the claim already ended: nothing left to time
            return
        log.warning("cannot arm TTL timer in %s (%s); relying on reap()", member.name, exc)


def cold_start(
    launcher: MemberLauncher, spec: PoolSpec, *, name: str, ttl_sec: int, owner: OwnerProcess, extra: dict[str, str]
) -> str:
    """A member created straight under the sandbox name: its own labels are the claim."""
    labels = L.container_labels(
        sandbox=name,
        role=Role.POOL_MEMBER,
        owner=owner,
        created_at=time.time(),
        ttl_sec=ttl_sec,
        network=spec.network,
        pool=spec.name,
        extra=extra,
    )
    container_id = launcher.create_container(
        name=name,
        image=spec.image,
        cpus=spec.cpus,
        memory_gb=spec.memory_gb,
        network=spec.network,
        ttl_sec=ttl_sec,
        labels=labels,
    )
    launcher.start_container(container_id)
    return container_id
