"""The skypilot-emulator's HTTP API: one pydantic model per request and answer, shared by the
server (``app``) and the client (``client``), so both sides read the same description.

Binary payloads (files, exec output) travel as raw bodies or base64. ``secrets=`` travels as
names only, as with SkyPilot, whose Secrets Manager injects the values: the server resolves them
from its own secrets store (``PUT /admin/secrets/{name}``, or ``--secret NAME`` at start), never
from the caller's environment, and never logs or writes them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_EXEC_TIMEOUT_SEC",
    "MAX_EXEC_TIMEOUT_SEC",
    "CreateRequest",
    "ExecRequest",
    "ExecResult",
    "ExecStarted",
    "FaultRule",
    "Knobs",
    "PoolCreateRequest",
    "PoolInfo",
    "PoolResize",
    "SandboxInfo",
    "SecretValue",
    "ServerStats",
    "SnapshotResult",
]

DEFAULT_EXEC_TIMEOUT_SEC = 60
MAX_EXEC_TIMEOUT_SEC = 3600


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateRequest(_Wire):
    """``create(...)``: a fresh sandbox from ``image``, or a claim from ``pool``."""

    name: str | None = None
    image: str | None = None
    pool: str | None = None
    num_sandboxes: int | None = Field(None, ge=1, le=256)
    cpus: float | None = None
    memory_gb: float | None = None
    env: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    block_network: bool = False
    timeout: int | None = None
    registry: str | None = None
    context_name: str | None = None
    namespace: str | None = None
    ports: list[int] = Field(default_factory=list)
    volumes: dict[str, str] = Field(default_factory=dict)
    enable_docker: bool = False


class SandboxInfo(_Wire):
    """One sandbox as ``ls()`` reports it; ``status`` is SkyPilot's upper-case pod phase."""

    name: str
    status: str
    image: str
    pool: str | None = None
    created_at: float
    expires_at: float | None = None
    endpoints: dict[str, str] = Field(default_factory=dict)
    # Why a FAILED sandbox stopped, as its pod's status message says (an eviction's reason).
    status_message: str | None = None


class ExecRequest(_Wire):
    argv: list[str] = Field(min_length=1)
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float | None = None


class ExecStarted(_Wire):
    exec_id: str


class ExecResult(_Wire):
    """A finished command: exit code (124 when its timeout killed it) and base64 output."""

    exit_code: int
    stdout_b64: str
    stderr_b64: str
    timed_out: bool = False


class SnapshotResult(_Wire):
    image: str


class PoolCreateRequest(_Wire):
    """``create_pool(name, image, cpus, memory_gb, replicas, enable_docker)``: SkyPilot's
    documented signature, which has no network option."""

    name: str
    image: str
    cpus: float | None = None
    memory_gb: float | None = None
    replicas: int = Field(1, ge=0)
    enable_docker: bool = False


class PoolResize(_Wire):
    replicas: int = Field(ge=0)


class PoolInfo(_Wire):
    """A warm pool: its shape and how many members are idle (ready to claim), claimed or
    starting. The server's view (its dashboard's); SkyPilot's SDK has no call returning it."""

    name: str
    image: str
    cpus: float | None = None
    memory_gb: float | None = None
    replicas: int
    idle: int
    claimed: int
    starting: int = 0


class SecretValue(_Wire):
    value: str = Field(repr=False)


class FaultRule(_Wire):
    """Queue ``count`` faults of ``kind`` for the next calls whose path starts with ``path``
    (and whose method is ``method``, when given): deterministic, for tests."""

    kind: str = Field(pattern="^(503|429|reset|reset-after|hang|evict)$")
    path: str = "/"
    method: str | None = None
    count: int = Field(1, ge=1)


class Knobs(_Wire):
    """The server's realism knobs (``PUT /admin/knobs``; also the CLI flags).

    Rates are probabilities per API call drawn from a ``seed``-ed generator, so a run's fault
    pattern repeats. ``rate_reset_after``: the call runs, then its connection is reset before the
    answer (a load balancer dropping a response): the client cannot tell it from a plain reset.
    ``hang_sec``: how long a "hang" fault holds a call before answering 503.
    ``evict_rate``: the chance per API call that one random live sandbox is evicted."""

    latency_ms: float = Field(80.0, ge=0)
    cold_create_sec: float = Field(0.0, ge=0)
    pool_claim_sec: float = Field(0.0, ge=0)
    seed: int = 0
    rate_503: float = Field(0.0, ge=0, le=1)
    rate_429: float = Field(0.0, ge=0, le=1)
    rate_reset: float = Field(0.0, ge=0, le=1)
    rate_reset_after: float = Field(0.0, ge=0, le=1)
    rate_hang: float = Field(0.0, ge=0, le=1)
    evict_rate: float = Field(0.0, ge=0, le=1)
    retry_after_sec: float = Field(1.0, ge=0)
    hang_sec: float = Field(600.0, ge=0)
    # A pool member takes this long after it starts to be ready (a pod's scheduling and image
    # pull); ``create_pool`` / ``set_pool_size`` wait at most ``pool_warm_timeout_sec`` for
    # every replica to be ready, then fail with the pool still warming (SkyPilot's SDK timeout).
    pool_warm_sec: float = Field(0.0, ge=0)
    pool_warm_timeout_sec: float = Field(180.0, ge=0)


class ServerStats(_Wire):
    """What the server did: calls served and faults injected, by kind (for tests and benches)."""

    pid: int
    calls: int
    faults: dict[str, int]
    evicted: list[str]
    knobs: Knobs
    calls_by_route: dict[str, int] = Field(default_factory=dict)
    faults_by_sandbox: dict[str, dict[str, int]] = Field(default_factory=dict)
