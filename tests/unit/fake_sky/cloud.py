"""A fake SkyPilot: its sandboxes, warm pools, images, secrets, faults and the calls it saw.

SkyPilot's answers, as its docs and examples give them and the skypilot-emulator copies them:
names are DNS-1123 (at most 53 characters); a second live sandbox or pool of a name is a 409;
``image=`` (or ``cpus``, ``memory_gb``, ``block_network``) with ``pool=`` is a 400; a claim of a
missing pool a 404 and of a pool with no ready member a 409; ``delete_pool`` is a 500 while a
sandbox claimed from it lives; ``terminate`` is idempotent. Pools are warm at once: a claim takes
a ready member and the pool refills in the same instant (so ``idle`` is always the pool's size).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import Conflict, InvalidRequest, NotFound, NotSupported, ServerError
from .faults import Faults
from .sandbox import FakeSandbox
from .tree import Tree
from .twins import Twin

__all__ = ["FakeImage", "FakeSky", "PoolRecord", "SandboxRecord", "SdkCall"]

DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_NAME = 53
# create() keywords SkyPilot documents and the fake does not implement: refused when set.
DOCUMENTED_UNSUPPORTED = ("num_sandboxes", "volumes", "ports", "enable_docker")


@dataclass(frozen=True)
class SdkCall:
    """One call the fake received: ``call`` (``create``, ``exec``, ...), the sandbox it was made
    on (None for module-level calls), and its arguments as given."""

    call: str
    sandbox: str | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class FakeImage:
    """What a fake image holds: files (path -> bytes, mode 0644; executable when the path is in
    ``executables``) and the directory commands start in (its WORKDIR)."""

    files: dict[str, bytes] = field(default_factory=dict)
    executables: frozenset[str] = frozenset()
    workdir: str = "/"

    def tree(self) -> Tree:
        tree = Tree()
        tree.mkdir(self.workdir, parents=True)
        for path, data in self.files.items():
            tree.mkdir(path.rsplit("/", 1)[0] or "/", parents=True)
            tree.write(path, data, mode=0o755 if path in self.executables else 0o644)
        return tree


@dataclass
class SandboxRecord:
    """An ``ls()`` record: terminable through its own ``terminate`` (as SkyPilot's handles)."""

    name: str
    status: str
    pool: str | None
    image: str | None
    status_message: str | None
    terminate: Twin


@dataclass
class PoolRecord:
    """``get_pool()``: the pool view the Docker SDK offers and SkyPilot's does not."""

    name: str
    image: str
    size: int
    idle: int
    claimed: int


@dataclass
class _Pool:
    name: str
    image: str
    replicas: int
    shape: dict[str, Any]


def _valid(name: str, kind: str) -> str:
    if len(name) > MAX_NAME or not DNS_1123.fullmatch(name):
        raise InvalidRequest(f"{kind} name {name!r} is not a DNS-1123 label of at most {MAX_NAME} characters")
    return name


class FakeSky:
    """One fake cloud; the module-level calls of ``tests.unit.fake_sky`` go to the current one."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.images: dict[str, FakeImage] = {}
        self.secrets: dict[str, str] = {}
        self.calls: list[SdkCall] = []
        self.faults = Faults()
        self._pools: dict[str, _Pool] = {}
        self._images_of: dict[str, str | None] = {}
        self.create = Twin(self._create)
        self.ls = Twin(self._ls)
        self.create_pool = Twin(self._create_pool)
        self.set_pool_size = Twin(self._set_pool_size)
        self.get_pool = Twin(self._get_pool)
        self.delete_pool = Twin(self._delete_pool)

    # ── what tests ask of the cloud ───────────────────────────────────────────────

    def add_image(self, name: str, image: FakeImage | None = None) -> None:
        self.images[name] = image or FakeImage()

    def record(self, call: str, sandbox: str | None, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.calls.append(SdkCall(call, sandbox, tuple(args), dict(kwargs)))

    def calls_of(self, call: str) -> list[SdkCall]:
        return [c for c in self.calls if c.call == call]

    def lose(self, name: str, *, status: str | None = None, message: str | None = None) -> None:
        """The infrastructure loses sandbox ``name``: gone from ``ls()`` (``status`` None) or
        listed with ``status`` and ``message`` (an evicted pod); its commands end."""
        sandbox = self.sandboxes[name]
        sandbox.went_away(status, message)
        if status is None:
            del self.sandboxes[name]

    def remove(self, name: str) -> None:
        sandbox = self.sandboxes.pop(name, None)
        if sandbox is not None:
            sandbox.went_away(None, None)

    def live(self) -> list[str]:
        return sorted(name for name, sandbox in self.sandboxes.items() if sandbox.live)

    # ── sandboxes ─────────────────────────────────────────────────────────────────

    async def _create(
        self,
        name: str | None = None,
        image: str | None = None,
        *,
        pool: str | None = None,
        cpus: float | None = None,
        memory_gb: float | None = None,
        env: dict[str, str] | None = None,
        secrets: list[str] | None = None,
        timeout: int | None = None,
        block_network: bool | None = None,
        registry: str | None = None,
        context_name: str | None = None,
        namespace: str | None = None,
        **unsupported: Any,
    ) -> FakeSandbox:
        given = {
            k: v for k, v in locals().items() if k not in ("self", "name", "image", "unsupported") and v is not None
        }
        self.record("create", None, (), {"name": name, "image": image, **given, **unsupported})
        self.faults.check("create")
        unknown_keywords = sorted(set(unsupported) - set(DOCUMENTED_UNSUPPORTED))
        if unknown_keywords:
            raise TypeError(f"create() got unexpected keyword argument(s) {', '.join(unknown_keywords)}")
        refused = sorted(k for k, v in unsupported.items() if v)
        if refused:
            raise NotSupported(f"the fake SDK does not implement {', '.join(refused)}= (SkyPilot does)")
        name = _valid(name or f"sandbox-{uuid.uuid4().hex[:8]}", "sandbox")
        if name in self.sandboxes:
            raise Conflict(f"a sandbox named {name!r} already exists")
        unknown = sorted(set(secrets or ()) - set(self.secrets))
        if unknown:
            raise InvalidRequest(f"unknown secret(s) {', '.join(unknown)}")
        if pool is not None:
            image = self._claim(pool, image=image, cpus=cpus, memory_gb=memory_gb, block_network=block_network)
        elif not image:
            raise InvalidRequest("image is required unless pool= is given")
        made = self.images.get(image, FakeImage())
        all_env = {**{s: self.secrets[s] for s in secrets or ()}, **(env or {})}
        sandbox = FakeSandbox(self, name, made.tree(), all_env, workdir=made.workdir, pool=pool)
        self.sandboxes[name] = sandbox
        self._images_of[name] = image
        if self.faults.create_delay:
            await asyncio.sleep(self.faults.create_delay)
        self.faults.check("create", after=True)
        return sandbox

    async def _ls(self) -> list[SandboxRecord]:
        self.record("ls", None, (), {})
        self.faults.check("ls")
        return [
            SandboxRecord(
                name, s.status or "TERMINATED", s.pool, self._images_of.get(name), s.status_message, s.terminate
            )
            for name, s in sorted(self.sandboxes.items())
        ]

    # ── pools ─────────────────────────────────────────────────────────────────────

    def _pool(self, name: str) -> _Pool:
        found = self._pools.get(name)
        if found is None:
            raise NotFound(f"pool {name!r} not found")
        return found

    def _claimed(self, pool: str) -> list[str]:
        return [name for name, s in self.sandboxes.items() if s.pool == pool and s.live]

    def _claim(self, pool: str, **fixed: Any) -> str:
        given = sorted(k for k, v in fixed.items() if v)
        if given:
            raise InvalidRequest(f"{', '.join(given)} come(s) from the pool: do not pass them with pool=")
        found = self._pool(pool)
        if found.replicas < 1:
            raise Conflict(f"pool {pool!r} has no ready member")
        return found.image

    async def _create_pool(
        self,
        name: str,
        image: str,
        cpus: float | None = None,
        memory_gb: float | None = None,
        replicas: int = 1,
        enable_docker: bool = False,
    ) -> PoolRecord:
        self.record("create_pool", None, (name, image), {"cpus": cpus, "memory_gb": memory_gb, "replicas": replicas})
        self.faults.check("create_pool")
        if enable_docker:
            raise NotSupported("the fake SDK does not implement enable_docker= (SkyPilot does)")
        if name in self._pools:
            raise Conflict(f"a pool named {name!r} already exists")
        if replicas < 0:
            raise InvalidRequest(f"replicas must be >= 0, got {replicas}")
        self._pools[_valid(name, "pool")] = _Pool(name, image, replicas, {"cpus": cpus, "memory_gb": memory_gb})
        return await self._view(name)

    async def _set_pool_size(self, name: str, replicas: int) -> PoolRecord:
        self.record("set_pool_size", None, (name, replicas), {})
        self.faults.check("set_pool_size")
        if replicas < 0:
            raise InvalidRequest(f"replicas must be >= 0, got {replicas}")
        self._pool(name).replicas = replicas
        return await self._view(name)

    async def _get_pool(self, name: str) -> PoolRecord:
        self.record("get_pool", None, (name,), {})
        self.faults.check("get_pool")
        return await self._view(name)

    async def _view(self, name: str) -> PoolRecord:
        found = self._pool(name)
        return PoolRecord(name, found.image, found.replicas, found.replicas, len(self._claimed(name)))

    async def _delete_pool(self, name: str) -> None:
        self.record("delete_pool", None, (name,), {})
        self.faults.check("delete_pool")
        self._pool(name)
        claimed = self._claimed(name)
        if claimed:
            raise ServerError(f"pool {name!r} has claimed sandboxes ({', '.join(claimed)}): terminate them first")
        del self._pools[name]

    def pools(self) -> list[str]:
        return sorted(self._pools)
