"""A Docker-backed implementation of the ``sky.sandbox`` SDK surface that Harbor calls.

Harbor's ``SkypilotEnvironment`` talks to ``sky.sandbox`` (``create.aio``, ``exec.aio`` +
``await handle.wait()``, ``write_bytes.aio``, ``read_bytes.aio``, ``terminate.aio``, pools via
``create(pool=)``). SkyPilot sandboxes need the SkyPilot Platform; this module gives the same
surface on a local Docker engine so trials, tests and benchmarks run on one machine, and so that
``conformance.py`` can prove both implementations agree.

How the semantics are mapped:

* A sandbox is a container running ``sleep <ttl>`` under ``init=True``: the TTL is enforced by
  the container itself (``auto_remove`` deletes it when the sleep ends), and ``reap()`` removes
  what a crash left behind (expired, stopped, or owned by a dead process).
* ``exec`` is ``docker exec`` with an argv list, no implicit shell. Runc makes every exec a
  session leader, so a timeout SIGKILLs the whole session from the host (the engine runs on
  this machine), and reports 124 like ``timeout(1)``.
* Every container is bounded (``bounds.py``): the requested or default CPU and memory (no
  swap), a pid limit, a size-limited tmpfs ``/tmp``, a file size limit at the disk bound, and its
  writable layer's bytes (by the engine, or by the host's watch, which evicts a sandbox past it:
  ``layer_bound``) and inodes (by the watch). It runs without
  NET_RAW and AUDIT_WRITE and with no-new-privileges (``privileges.py``).
* Files go through the engine's archive API (``put_archive`` / ``get_archive``): binary-safe,
  no shell quoting, works for any size.
* All state lives in the engine (labels, names, labelled volumes), so any process can list,
  adopt or clean up what another created. Pools are in ``pools``.

Every call is a blocking function with an ``.aio`` coroutine twin. The blocking work runs on a
dedicated thread pool sized for many concurrent exec waits (the default executor is small and
shared with the rest of the program).

This module is the facade (what ``registry.load_sandbox_sdk("docker")`` returns in place of ``sky.sandbox``): the
public calls, `DockerSandbox`, and the error classes. The machinery lives beside it, one job per
module: ``calls`` (the executor and the sync/``.aio`` wrapper), ``engine`` (the
Docker client and container primitives), ``exec`` (running commands, deadlines,
handles), ``files`` (the archive-based file transfer), ``reap`` (cleanup of
stale containers) and ``pools`` (warm pools).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Mapping, Sequence

from osmosis_harbor import settings
from osmosis_harbor.errors import (
    DockerEngineUnavailable,
    ImageNotFoundError,
    PoolExistsError,
    PoolNotFoundError,
    SandboxExistsError,
    SandboxNotFoundError,
)
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker import pools as pools_mod
from osmosis_harbor.sandbox.docker import reap as docker_reap
from osmosis_harbor.sandbox.docker.engine import Engine, get_engine

# Part of the SDK's contract (the exit code a timed-out exec reports), so callers find it here.
from osmosis_harbor.sandbox.docker.exec import (
    TIMEOUT_EXIT_CODE,
    AsyncExecHandle,
    ExecHandle,
    ExecMethod,
    check_env,
    exec_timeout,
)
from osmosis_harbor.sandbox.docker.inventory import list_containers
from osmosis_harbor.sandbox.docker.labels import (
    Network,
    OwnerProcess,
    PoolInfo,
    PoolSpec,
    RemovedContainer,
    Role,
    SandboxRecord,
)
from osmosis_harbor.sandbox.docker.reap import disable_auto_reap, pause_auto_reap
from osmosis_harbor.sandbox.docker.sandbox import DockerSandbox
from osmosis_harbor.sandbox.sdk.calls import Dual, dual

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "AsyncExecHandle",
    "DockerEngineUnavailable",
    "DockerSandbox",
    "Engine",
    "ExecMethod",
    "ExecHandle",
    "ImageNotFoundError",
    "PoolExistsError",
    "PoolInfo",
    "PoolNotFoundError",
    "PoolSpec",
    "RemovedContainer",
    "SandboxExistsError",
    "SandboxNotFoundError",
    "SandboxRecord",
    "create",
    "create_pool",
    "delete_pool",
    "exec_timeout",
    "get",
    "get_engine",
    "get_pool",
    "list_pools",
    "ls",
    "disable_auto_reap",
    "evicted",
    "pause_auto_reap",
    "reap",
    "remove_all",
    "set_pool_size",
    "terminate_by_name",
]

DEFAULT_TTL_SEC = 86_400


# ── module API ───────────────────────────────────────────────────────────────────────────────


def _network(block_network: bool, host_network: bool) -> Network:
    if block_network and host_network:
        raise ValueError("block_network and host_network are mutually exclusive")
    return "none" if block_network else "host" if host_network else "bridge"


def _ttl(timeout: int | None) -> int:
    if timeout is None:
        return DEFAULT_TTL_SEC
    if int(timeout) <= 0:
        raise ValueError("timeout (the sandbox TTL, seconds) must be positive")
    return int(timeout)


def _secret_env(secrets: Sequence[str] | None) -> dict[str, str]:
    """Secret values come from this process's environment and go only into the container env."""
    values: dict[str, str] = {}
    for secret in secrets or ():
        value = settings.host_variable(secret)
        if value is None:
            raise ValueError(f"secret {secret!r} is not set in the environment of this process")
        values[secret] = value
    return values


def _check_pool_args(image: str | None, cpus: float | None, memory_gb: float | None) -> None:
    """Like the real SDK: a pool fixes image and resources. Network flags are checked against
    the pool's own network at claim time (asking for what the pool already has is allowed)."""
    if image is not None:
        raise ValueError("image comes from the pool: do not pass image= together with pool=")
    if cpus is not None or memory_gb is not None:
        raise ValueError("cpus/memory_gb come from the pool: do not pass them together with pool=")


def _create(
    name: str | None = None,
    image: str | None = None,
    pool: str | None = None,
    cpus: float | None = None,
    memory_gb: float | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] | None = None,
    block_network: bool = False,
    timeout: int | None = None,
    registry: str | None = None,
    context_name: str | None = None,
    namespace: str | None = None,
    host_network: bool = False,
    owner: OwnerProcess | None = None,
    num_sandboxes: int | None = None,
    start_if_empty: bool = True,
) -> DockerSandbox | list[DockerSandbox]:
    """Create a running sandbox, or claim one from *pool*; see the module docstring.

    ``num_sandboxes=k`` (pools only, as in SkyPilot's SDK) claims k members in one call and
    returns them as a list, named ``<name>-<i>`` for i in 0..k-1 (``name`` is the prefix).
    ``owner``: whom the sandbox belongs to, when not this process (a service creating on a
    caller's behalf: the skypilot-emulator server's sandboxes outlive the server).
    ``start_if_empty``: a claim from a pool with no ready member starts one (this SDK's own
    semantics); ``False`` refuses it with `PoolExhaustedError`, as SkyPilot's pools do."""
    if num_sandboxes is not None:
        if pool is None:
            raise ValueError("num_sandboxes claims several members of a pool: pass pool= with it")
        if isinstance(num_sandboxes, bool) or not isinstance(num_sandboxes, int) or num_sandboxes < 1:
            raise ValueError(f"num_sandboxes must be an integer >= 1, got {num_sandboxes!r}")
        prefix = name or f"sb-{uuid.uuid4().hex[:12]}"
        members: list[DockerSandbox] = []
        try:
            for i in range(num_sandboxes):
                one = _create(
                    f"{prefix}-{i}", None, pool, None, None, env, secrets, block_network, timeout,
                    registry, context_name, namespace, host_network, owner, start_if_empty=start_if_empty,
                )  # fmt: skip
                assert isinstance(one, DockerSandbox)
                members.append(one)
        except BaseException:
            for member in members:  # all or nothing, like one call
                member.terminate()
            raise
        return members
    name = L.validate_name(name or f"sb-{uuid.uuid4().hex[:12]}")
    ttl = _ttl(timeout)
    network = _network(block_network, host_network)
    persistent = {**check_env(env or {}), **_secret_env(secrets)}
    extra = {L.NAMESPACE: namespace or "", L.CONTEXT: context_name or "", L.REGISTRY: registry or ""}
    if pool is not None:
        _check_pool_args(image, cpus, memory_gb)
    elif not image:
        raise ValueError("image is required unless pool= is given")
    engine = get_engine()
    engine.maybe_auto_reap()
    owner = owner or OwnerProcess.current()
    if pool is not None:
        engine.ensure_name_free(name)
        container_id, spec = engine.pools.claim(
            pool,
            name=name,
            ttl_sec=ttl,
            owner=owner,
            extra=extra,
            network=None if network == "bridge" else network,
            start_if_empty=start_if_empty,
        )
        engine.layers.claimed(container_id, disk_mb=engine.config.sandbox_disk_mb, inodes=engine.config.sandbox_inodes)
        return DockerSandbox(engine, name=name, container_id=container_id, image=spec.image, pool=pool, env=persistent)
    assert image is not None
    labels = L.container_labels(
        sandbox=name, role=Role.SANDBOX, owner=owner, created_at=time.time(), ttl_sec=ttl, network=network, extra=extra
    )
    make = functools.partial(
        engine.create_container,
        name=name,
        image=image,
        cpus=cpus,
        memory_gb=memory_gb,
        network=network,
        ttl_sec=ttl,
        labels=labels,
        env=persistent,
    )
    try:
        container_id = make()
    except SandboxExistsError:  # a stale holder of the name (expired, dead owner) is cleared once
        engine.ensure_name_free(name)
        container_id = make()
    try:
        engine.start_container(container_id)
    except BaseException:
        engine.remove_container(container_id, claimed=False)
        raise
    return DockerSandbox(engine, name=name, container_id=container_id, image=image, pool=None, env=persistent)


def _terminate_made(made: DockerSandbox | list[DockerSandbox]) -> None:
    for sandbox in made if isinstance(made, list) else [made]:
        sandbox.terminate()


create: Dual[..., DockerSandbox | list[DockerSandbox]] = Dual(_create, on_abandon=_terminate_made)


@dual
def get(name: str) -> DockerSandbox:
    """Attach to an existing sandbox by name (its create-time env is not known here)."""
    engine = get_engine()
    info = engine.inspect_info(name)
    if info is None or info.is_idle_member:
        raise SandboxNotFoundError(f"no sandbox named {name!r}")
    return DockerSandbox(engine, name=info.name, container_id=info.id, image=info.image, pool=info.pool)


@dual
def terminate_by_name(name: str) -> bool:
    """Remove the sandbox called *name* if it exists (for callers that never got a handle).

    Returns whether something was removed; idle pool members are never touched.
    """
    engine = get_engine()
    engine.layers.evictions.forget(name=name)
    info = engine.inspect_info(name)
    if info is None or info.is_idle_member:
        return False
    return engine.remove_container(info.id, wait=True)


@dual
def evicted(name: str) -> SandboxRecord | None:
    """The record of sandbox *name* if this process evicted it for its disk use (until terminated)."""
    return get_engine().layers.evictions.named(name)


@dual
def ls() -> list[SandboxRecord]:
    """All managed sandboxes on the engine, any owner (idle pool members are not sandboxes), and
    those this process evicted for their disk use, with status ``evicted``, until terminated."""
    engine = get_engine()
    listed = [i for i in list_containers(engine.api) if not i.is_idle_member]
    return sorted(engine.layers.evictions.listing(listed), key=lambda r: r.created_at)


def _reap(expired: bool = True, dead_owners: bool = True) -> list[RemovedContainer]:
    """Remove expired/stopped sandboxes and those whose owner process on this host died.

    Idle pool members are removed only when expired or stopped. Returns what was removed.
    """
    return docker_reap.reap(get_engine(), expired=expired, dead_owners=dead_owners)


reap: Dual[..., list[RemovedContainer]] = Dual(_reap)


@dual
def remove_all(owner_pid: int | None = None) -> list[RemovedContainer]:
    """Remove every managed container (or those owned by *owner_pid* on this host).

    With no owner this also drops every pool spec and claim; with an owner, the pools that
    process created. For test teardown and ``osmosis-harbor`` cleanup commands.
    """
    return docker_reap.remove_all(get_engine(), owner_pid)


# ── pools ────────────────────────────────────────────────────────────────────────────────────


@dual
def create_pool(
    name: str,
    image: str,
    cpus: float | None = None,
    memory_gb: float | None = None,
    replicas: int = 1,
    *,
    member_ttl_sec: int = pools_mod.DEFAULT_MEMBER_TTL_SEC,
    host_network: bool = False,
    block_network: bool = False,
    wait: bool = True,
) -> PoolInfo:
    """Define a warm pool and return once *replicas* members are running (idempotent; at once
    with ``wait=False``)."""
    return get_engine().pools.create_pool(
        name,
        image,
        cpus=cpus,
        memory_gb=memory_gb,
        replicas=replicas,
        member_ttl_sec=member_ttl_sec,
        network=_network(block_network, host_network),
        wait=wait,
    )


@dual
def set_pool_size(name: str, replicas: int, *, wait: bool = True) -> PoolInfo:
    """Resize a pool: growing returns when the new members run (at once with ``wait=False``);
    shrinking drops idle ones."""
    return get_engine().pools.set_pool_size(name, replicas, wait=wait)


@dual
def delete_pool(name: str) -> list[RemovedContainer]:
    """Delete the pool spec and its idle members (claimed sandboxes are left alone)."""
    return get_engine().pools.delete_pool(name)


@dual
def get_pool(name: str) -> PoolInfo:
    """The pool's spec with idle / claimed / starting member counts."""
    return get_engine().pools.get_pool(name)


@dual
def list_pools() -> list[PoolInfo]:
    """Every pool defined on the engine."""
    return get_engine().pools.list_pools()
