"""The emulator account's warm pools, as SkyPilot's behave (a mixin of ``state.Emulator``).

Built on the Docker SDK's pools (``sandbox/docker/pools.py``), with SkyPilot's refusals: an
existing name is refused by ``create_pool``; ``create_pool`` and ``set_pool_size`` answer once
the pool is fully warm or the warm timeout passed (the answer says which, and the SDK raises
for the second); ``delete_pool`` is refused with a 500 while a sandbox claimed from the pool
exists. A pool is the account's whose spec this server (or a predecessor) wrote; another
account's is not found, and its name is refused.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.docker.labels import POOL_SPEC, validate_name
from osmosis_harbor.sandbox.emulator.errors import (
    InvalidRequestError,
    NotSupportedError,
    PoolExistsError,
    PoolInUseError,
    PoolNotFoundError,
)
from osmosis_harbor.sandbox.emulator.server import images
from osmosis_harbor.sandbox.emulator.wire import Knobs, PoolCreateRequest, PoolInfo
from osmosis_harbor.sandbox.sdk.calls import run_blocking

__all__ = ["AccountPools", "pool_info"]


def _valid_pool(name: str) -> str:
    try:
        return validate_name(name, kind="pool")
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


class AccountPools:
    """The pool calls of one emulator account."""

    knobs: Knobs
    _pool_host: str
    _account_pids: frozenset[int]

    if TYPE_CHECKING:  # the account's sandboxes: ``Emulator``'s

        async def _records(self) -> list[docker_sdk.SandboxRecord]: ...

    async def create_pool(self, req: PoolCreateRequest) -> PoolInfo:
        """A new pool, answered once it is fully warm or the warm timeout passed (the answer
        says which). A name that exists is refused, as SkyPilot's examples read it."""
        _valid_pool(req.name)
        if req.enable_docker:
            raise NotSupportedError("the skypilot-emulator does not implement enable_docker= (SkyPilot does)")
        owners = (await run_blocking(self._pool_owners)).get(req.name)
        if owners is not None and not self._owns(owners):
            raise PoolExistsError(
                f"pool {req.name!r} belongs to another emulator account on this Docker engine: choose another name"
            )
        if owners is not None:
            raise PoolExistsError(f"pool {req.name!r} already exists: resize it with set_pool_size, or delete it first")
        await asyncio.to_thread(images.pull, req.image)
        await docker_sdk.create_pool.aio(
            req.name, req.image, cpus=req.cpus, memory_gb=req.memory_gb, replicas=req.replicas, wait=False
        )
        return await self._warmed(req.name)

    async def set_pool_size(self, name: str, replicas: int) -> PoolInfo:
        await self._own_pool(name)
        await docker_sdk.set_pool_size.aio(name, replicas, wait=False)
        return await self._warmed(name)

    async def _warmed(self, name: str) -> PoolInfo:
        """The pool once every replica is ready, or as it stands at the warm timeout."""
        deadline = time.monotonic() + self.knobs.pool_warm_timeout_sec
        delay = 0.05
        while True:
            info = await docker_sdk.get_pool.aio(name)
            if info.idle >= info.spec.replicas or time.monotonic() + delay > deadline:
                return pool_info(info)
            if info.starting == 0:
                await run_blocking(lambda: docker_sdk.get_engine().pools.refill(name))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def delete_pool(self, name: str) -> None:
        """Refused with a 500 while a sandbox claimed from the pool exists (SkyPilot's, verified
        by its pool clean-up example, which terminates the members first)."""
        await self._own_pool(name)
        claimed = [r.name for r in await self._records() if r.pool == name]
        if claimed:
            raise PoolInUseError(
                f"pool {name!r} is referenced by {len(claimed)} sandbox(es) ({', '.join(sorted(claimed)[:5])}): "
                "terminate them before deleting the pool"
            )
        await docker_sdk.delete_pool.aio(name)

    async def get_pool(self, name: str) -> PoolInfo:
        await self._own_pool(name)
        return pool_info(await docker_sdk.get_pool.aio(name))

    async def list_pools(self) -> list[PoolInfo]:
        owners = await run_blocking(self._pool_owners)
        return [pool_info(p) for p in await docker_sdk.list_pools.aio() if self._owns(owners.get(p.spec.name, set()))]

    def _pool_owners(self) -> dict[str, set[tuple[str | None, int | None]]]:
        """Each pool on the engine, with the processes that wrote its spec (its generations): this
        server when the pool is this account's (the Docker SDK records the creating process)."""
        volumes = docker_sdk.get_engine().api.volumes(filters={"label": POOL_SPEC})["Volumes"] or []
        owners: dict[str, set[tuple[str | None, int | None]]] = {}
        for volume in volumes:
            labels = volume.get("Labels") or {}
            owner = OwnerProcess.from_labels(labels)
            owners.setdefault(labels[POOL_SPEC], set()).add((owner.host, owner.pid) if owner else (None, None))
        return owners

    def _owns(self, owners: set[tuple[str | None, int | None]]) -> bool:
        """A pool is this account's when this server (or a predecessor) wrote every spec of it."""
        return bool(owners) and all(host == self._pool_host and pid in self._account_pids for host, pid in owners)

    async def _own_pool(self, name: str) -> None:
        """Refuse a pool this account did not make as SkyPilot refuses an unknown one: another
        account's pools (another emulator server's, the Docker SDK's) are not visible to it."""
        if not self._owns((await run_blocking(self._pool_owners)).get(name, set())):
            raise PoolNotFoundError(f"no pool named {name!r}")


def pool_info(info: Any) -> PoolInfo:
    spec = info.spec
    return PoolInfo(
        name=spec.name,
        image=spec.image,
        cpus=spec.cpus,
        memory_gb=spec.memory_gb,
        replicas=spec.replicas,
        idle=info.idle,
        claimed=info.claimed,
        starting=info.starting,
    )
