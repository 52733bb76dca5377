"""Engine-side metadata of the Docker sandbox emulation: label keys, names, records.

Everything the Docker implementation knows about a sandbox lives in the engine (container
labels, container names and a few labelled volumes), never in process memory alone. That is
what lets another process (a CLI, a later pytest run, ``reap()``) list, adopt or clean up
sandboxes it did not create. This module holds the vocabulary for that metadata, the pydantic
records built from it; it does not talk to Docker.
"""

from __future__ import annotations

import re
import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from osmosis_harbor.owner_process import OWNER_HOST as OWNER_HOST
from osmosis_harbor.owner_process import OWNER_PID as OWNER_PID
from osmosis_harbor.owner_process import OWNER_START as OWNER_START
from osmosis_harbor.owner_process import OwnerProcess

PREFIX = "osmosis-harbor"

# Container labels (also reused on the claim and pool-spec volumes where they apply).
MANAGED = f"{PREFIX}.managed"
SANDBOX = f"{PREFIX}.sandbox"
POOL = f"{PREFIX}.pool"
CREATED_AT = f"{PREFIX}.created-at"
TTL_SEC = f"{PREFIX}.ttl-sec"
EXPIRES_AT = f"{PREFIX}.expires-at"
NAMESPACE = f"{PREFIX}.namespace"
CONTEXT = f"{PREFIX}.context"
REGISTRY = f"{PREFIX}.registry"
NETWORK = f"{PREFIX}.network"
ROLE = f"{PREFIX}.role"
# When an idle pool member counts as ready (absent: once it runs); see pools.PoolManager.warm_sec.
READY_AT = f"{PREFIX}.ready-at"
# Claim volumes: the mutable part of a claimed pool member (labels on containers are immutable).
CLAIM_OF = f"{PREFIX}.claim-of"
# A sandbox's /tmp volume (anonymous, tmpfs): found again when its container was removed
# without its volumes (``docker rm -f`` by hand, an eviction) and reaped once dangling.
TMP_VOLUME = f"{PREFIX}.tmp-volume"
# Pool-spec volumes.
POOL_SPEC = f"{PREFIX}.pool-spec"
GENERATION = f"{PREFIX}.generation"
IMAGE = f"{PREFIX}.image"
CPUS = f"{PREFIX}.cpus"
MEMORY_GB = f"{PREFIX}.memory-gb"
REPLICAS = f"{PREFIX}.replicas"
MEMBER_TTL_SEC = f"{PREFIX}.member-ttl-sec"

MANAGED_FILTER = f"{MANAGED}=1"

# Idle pool members are named "<IDLE_PREFIX><pool>_<hex>". The underscore cannot occur in a
# DNS-1123 sandbox name, so an idle member can never be mistaken for a claimed sandbox.
IDLE_PREFIX = "ohpool_"
CLAIM_VOLUME_PREFIX = "ohclaim_"
SPEC_VOLUME_PREFIX = "ohpoolspec_"

MAX_NAME_LEN = 53
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Network = Literal["bridge", "host", "none"]


class Role(StrEnum):
    """What a managed container is for; idle vs claimed pool members are told apart by name."""

    SANDBOX = "sandbox"
    POOL_MEMBER = "pool-member"


def validate_name(name: str, *, kind: str = "sandbox") -> str:
    """Reject names the real SkyPilot SDK rejects (DNS-1123 label, at most 53 characters).

    Failing locally on names production would refuse keeps the emulation honest.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty string")
    if len(name) > MAX_NAME_LEN:
        raise ValueError(f"{kind} name {name!r} is longer than {MAX_NAME_LEN} characters")
    if not _DNS_1123.match(name):
        raise ValueError(
            f"{kind} name {name!r} is not DNS-1123: use lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def idle_member_name(pool: str, suffix: str) -> str:
    """Container name of an unclaimed pool member."""
    return f"{IDLE_PREFIX}{pool}_{suffix}"


def is_idle_member_name(name: str) -> bool:
    """True for containers still waiting in a pool (claiming renames them to the sandbox)."""
    return name.startswith(IDLE_PREFIX)


def now() -> float:
    """Wall-clock seconds; labels store wall time so other processes can compare."""
    return time.time()


def fmt_time(value: float) -> str:
    """Millisecond precision is enough for TTLs of a few seconds in tests."""
    return f"{value:.3f}"


def _float(labels: dict[str, str], key: str) -> float | None:
    raw = labels.get(key)
    try:
        return float(raw) if raw not in (None, "") else None
    except ValueError:
        return None


def _int(labels: dict[str, str], key: str) -> int | None:
    value = _float(labels, key)
    return int(value) if value is not None else None


def container_labels(
    *,
    sandbox: str,
    role: Role,
    owner: OwnerProcess,
    created_at: float,
    ttl_sec: int,
    network: Network,
    pool: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The full label set of a managed container; never put secret values in here."""
    labels = {
        MANAGED: "1",
        ROLE: role.value,
        SANDBOX: sandbox,
        POOL: pool or "",
        CREATED_AT: fmt_time(created_at),
        TTL_SEC: str(ttl_sec),
        EXPIRES_AT: fmt_time(created_at + ttl_sec),
        NETWORK: network,
        **owner.labels(),
    }
    labels.update({k: v for k, v in (extra or {}).items() if v})
    return labels


# ── records ─────────────────────────────────────────────────────────────────────────────────


class SandboxRecord(BaseModel):
    """One sandbox as `ls()` reports it (idle pool members are not sandboxes)."""

    name: str
    image: str
    pool: str | None = None
    status: str
    created_at: float
    expires_at: float | None = None
    owner_pid: int | None = None
    owner_host: str | None = None
    namespace: str | None = None
    container_id: str
    status_message: str | None = None  # why it stopped, when the SDK knows (an eviction's reason)


class ContainerInfo(BaseModel):
    """A managed container as seen in one engine listing, with its claim record merged in.

    For a claimed pool member the claim (owner, expiry, sandbox name) wins over the container's
    own immutable labels, which describe the process that created the member.
    """

    id: str
    name: str
    image: str
    state: str
    labels: dict[str, str] = Field(default_factory=dict)
    claim: dict[str, str] | None = None

    @classmethod
    def from_summary(cls, summary: dict[str, Any], claim: dict[str, str] | None) -> ContainerInfo:
        names = summary.get("Names") or ["/"]
        return cls(
            id=summary["Id"],
            name=names[0].lstrip("/"),
            image=summary.get("Image", ""),
            state=summary.get("State", "unknown"),
            labels=summary.get("Labels") or {},
            claim=claim,
        )

    @property
    def pool(self) -> str | None:
        return self.labels.get(POOL) or None

    @property
    def is_idle_member(self) -> bool:
        return self.pool is not None and is_idle_member_name(self.name)

    @property
    def _effective(self) -> dict[str, str]:
        return {**self.labels, **(self.claim or {})}

    @property
    def owner(self) -> OwnerProcess | None:
        return OwnerProcess.from_labels(self._effective)

    @property
    def created_at(self) -> float:
        return _float(self._effective, CREATED_AT) or 0.0

    @property
    def ready_at(self) -> float:
        return _float(self.labels, READY_AT) or 0.0

    @property
    def expires_at(self) -> float | None:
        own = _float(self.labels, EXPIRES_AT)
        claimed = _float(self.claim or {}, EXPIRES_AT)
        candidates = [v for v in (own, claimed) if v is not None]
        return min(candidates) if candidates else None

    def is_expired(self, at: float | None = None) -> bool:
        expires = self.expires_at
        return expires is not None and expires <= (at if at is not None else now())

    def to_record(self) -> SandboxRecord:
        eff = self._effective
        owner = self.owner
        return SandboxRecord(
            name=self.name,
            image=self.image,
            pool=self.pool,
            status=self.state,
            created_at=self.created_at,
            expires_at=self.expires_at,
            owner_pid=owner.pid if owner else None,
            owner_host=owner.host if owner else None,
            namespace=eff.get(NAMESPACE) or None,
            container_id=self.id,
        )


class RemovedContainer(BaseModel):
    """What `reap()` / `remove_all()` removed, and why (for CLI output and test assertions)."""

    name: str
    container_id: str
    reason: str
    pool: str | None = None


class PoolSpec(BaseModel):
    """A warm pool's definition, stored as labels on a Docker volume so every process sees it."""

    name: str
    image: str
    cpus: float | None = None
    memory_gb: float | None = None
    replicas: int = Field(ge=0)
    member_ttl_sec: int = Field(gt=0)
    network: Network = "bridge"
    created_at: float
    generation: int = 0

    def to_labels(self, owner: OwnerProcess) -> dict[str, str]:
        labels = {
            MANAGED: "1",
            POOL_SPEC: self.name,
            GENERATION: str(self.generation),
            IMAGE: self.image,
            REPLICAS: str(self.replicas),
            MEMBER_TTL_SEC: str(self.member_ttl_sec),
            NETWORK: self.network,
            CREATED_AT: fmt_time(self.created_at),
            **owner.labels(),
        }
        if self.cpus is not None:
            labels[CPUS] = repr(float(self.cpus))
        if self.memory_gb is not None:
            labels[MEMORY_GB] = repr(float(self.memory_gb))
        return labels

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> PoolSpec:
        return cls(
            name=labels[POOL_SPEC],
            image=labels[IMAGE],
            cpus=_float(labels, CPUS),
            memory_gb=_float(labels, MEMORY_GB),
            replicas=_int(labels, REPLICAS) or 0,
            member_ttl_sec=_int(labels, MEMBER_TTL_SEC) or 1,
            network=labels.get(NETWORK, "bridge"),
            created_at=_float(labels, CREATED_AT) or 0.0,
            generation=_int(labels, GENERATION) or 0,
        )


class PoolInfo(BaseModel):
    """A pool's spec plus how many members are idle, claimed, or still starting."""

    spec: PoolSpec
    idle: int
    claimed: int
    starting: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def replicas(self) -> int:
        return self.spec.replicas
