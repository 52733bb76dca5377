"""The emulator server's sandboxes and pools, held on the local Docker engine.

Everything durable lives in the engine, through our Docker SDK (labels, claim volumes, pool
spec volumes), so the server holds only caches: a sandbox handle is found again by name after
a restart, and a server killed mid-run loses nothing but its running execs' results. Sandboxes
carry the emulator's own owner (`EMULATOR_OWNER_HOST`), which no process on this host can be
judged dead by: like SkyPilot's pods, they live until terminated or until their TTL, whatever
happens to the client or the server. What a SkyPilot pod cannot do, this refuses (see
``check_*`` and ``images``). A sandbox past its disk bound (the server's
``OSMOSIS_HARBOR_SANDBOX_DISK_MB``, as a pod's ephemeral-storage limit is the cluster's) is
evicted by the Docker SDK's watch in this process, and listed as Kubernetes keeps an evicted pod:
``FAILED``, with kubelet's status message, until terminated.

One server is one SkyPilot account: its ``ls``, lookups, terminations and evictions see only
the sandboxes it made (owner pid = this server's, which a restart in place keeps, or one of its
predecessors': servers earlier started on the same state file), never those of another emulator
server on the same engine (another test session's, another bench run's). Its warm pools likewise:
a pool is the account's whose spec this server (or a predecessor) wrote; others' are not found,
and their names are refused to it (SkyPilot scopes pools to a workspace; the engine has one
namespace).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Sequence

from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.docker.exec import ExecRun
from osmosis_harbor.sandbox.docker.labels import validate_name
from osmosis_harbor.sandbox.emulator.errors import (
    InvalidRequestError,
    NotSupportedError,
    PoolExhaustedError,
    SandboxNotFoundError,
)
from osmosis_harbor.sandbox.emulator.server import images
from osmosis_harbor.sandbox.emulator.server.pool_state import AccountPools
from osmosis_harbor.sandbox.emulator.wire import (
    DEFAULT_EXEC_TIMEOUT_SEC,
    MAX_EXEC_TIMEOUT_SEC,
    CreateRequest,
    ExecRequest,
    ExecResult,
    Knobs,
    SandboxInfo,
)
from osmosis_harbor.sandbox.sdk.calls import run_blocking

__all__ = ["EMULATOR_OWNER_HOST", "Emulator", "check_exec_timeout"]

log = logging.getLogger(__name__)

EMULATOR_OWNER_HOST = f"skypilot-emulator.{socket.gethostname()}"
# Finished exec results kept for a client that asks again (a retried wait after a fault).
KEPT_EXEC_RESULTS = 4096
_STATUS = {"running": "RUNNING", "created": "PENDING", "restarting": "PENDING", "paused": "PAUSED"}


def check_exec_timeout(timeout_seconds: float | None) -> float:
    """SkyPilot's default (60 s) and cap (3600 s; more is refused, not clamped)."""
    if timeout_seconds is None:
        return float(DEFAULT_EXEC_TIMEOUT_SEC)
    if timeout_seconds <= 0:
        raise InvalidRequestError(f"timeout_seconds must be positive, got {timeout_seconds}")
    if timeout_seconds > MAX_EXEC_TIMEOUT_SEC:
        raise InvalidRequestError(f"timeout_seconds {timeout_seconds} exceeds the cap of {MAX_EXEC_TIMEOUT_SEC} s")
    return float(timeout_seconds)


def _check_supported(req: CreateRequest) -> None:
    unsupported = [
        n for n, v in (("ports", req.ports), ("volumes", req.volumes), ("enable_docker", req.enable_docker)) if v
    ]
    if unsupported:
        raise NotSupportedError(f"the skypilot-emulator does not implement {', '.join(unsupported)}= (SkyPilot does)")


# SkyPilot runs an exec through ``sh -c`` in the pod, ``workdir=`` as a plain ``cd``: a missing
# workdir or binary exits 127 with sh's message on stderr ("verified live", slime's sandbox_env).
_EXEC_SHIM = (
    'if [ -n "$1" ]; then cd "$1" 2>/dev/null || { echo "sh: cd: $1: No such file or directory" >&2; exit 127; }; fi; '
    'shift; exec "$@"'
)


def exec_argv(argv: Sequence[str], workdir: str | None) -> list[str]:
    """The command as the pod runs it: under ``sh``, in ``workdir`` (see ``_EXEC_SHIM``)."""
    return ["sh", "-c", _EXEC_SHIM, "sh", workdir or "", *argv]


def _names(req: CreateRequest) -> list[str]:
    """One name, or ``num_sandboxes`` names from the prefix (``rollout-0001``, ...)."""
    if req.num_sandboxes is None:
        return [req.name or f"sandbox-{uuid.uuid4().hex[:8]}"]
    prefix = req.name or f"sandbox-{uuid.uuid4().hex[:6]}"
    return [f"{prefix}-{i:04d}" for i in range(1, req.num_sandboxes + 1)]


def _valid(name: str, kind: str = "sandbox") -> str:
    try:
        return validate_name(name, kind=kind)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


class Emulator(AccountPools):
    """The server's view: handles by name (a cache over the engine) and running execs."""

    def __init__(
        self,
        knobs: Knobs,
        registry: str,
        *,
        predecessors: Sequence[int] = (),
        secrets: dict[str, str] | None = None,
    ) -> None:
        self.registry = registry
        self.knobs = knobs
        self.owner = OwnerProcess(pid=os.getpid(), host=EMULATOR_OWNER_HOST)
        self._account_pids = frozenset({self.owner.pid, *predecessors})
        # A pool's spec records the process that wrote it (this server), under the machine's name.
        self._pool_host = OwnerProcess.current().host
        self._handles: dict[str, docker_sdk.DockerSandbox] = {}
        self._execs: collections.OrderedDict[str, ExecRun] = collections.OrderedDict()
        self._exec_sandboxes: dict[str, str] = {}  # exec id -> sandbox name, while its result is kept
        self.evicted: list[str] = []
        self._pool_claims: dict[str, asyncio.Lock] = {}
        # The account's secrets store (SkyPilot's Secrets Manager): in memory only, never logged.
        self._secrets: dict[str, str] = dict(secrets or {})

    @property
    def knobs(self) -> Knobs:
        return self._knobs

    @knobs.setter
    def knobs(self, knobs: Knobs) -> None:
        self._knobs = knobs
        docker_sdk.get_engine().pools.warm_sec = knobs.pool_warm_sec  # this process's engine: the account's

    def register_secret(self, name: str, value: str) -> None:
        self._secrets[name] = value

    def forget_secret(self, name: str) -> None:
        self._secrets.pop(name, None)

    def _secret_values(self, names: Sequence[str]) -> dict[str, str]:
        missing = [name for name in names if name not in self._secrets]
        if missing:
            raise InvalidRequestError(
                f"secret(s) {', '.join(map(repr, missing))} not in the secrets store: register them with "
                "PUT /admin/secrets/NAME or the server's --secret NAME (values never come from the caller)"
            )
        return {name: self._secrets[name] for name in names}

    # ── sandboxes ─────────────────────────────────────────────────────────────────────────

    async def recover(self) -> int:
        """Adopt what the engine holds for the emulator (after a restart); returns the count."""
        for record in await self._records():
            self._handles.setdefault(record.name, await docker_sdk.get.aio(record.name))
        return len(self._handles)

    async def _records(self) -> list[docker_sdk.SandboxRecord]:
        """The emulator's sandboxes; one past its TTL is gone, whether or not it is removed yet."""
        now = time.time()
        return [
            r
            for r in await docker_sdk.ls.aio()
            if self._mine(r.owner_host, r.owner_pid) and (r.expires_at is None or r.expires_at > now)
        ]

    def _mine(self, host: str | None, pid: int | None) -> bool:
        """Made by this server (its account), not by another emulator server on the engine."""
        return host == EMULATOR_OWNER_HOST and pid in self._account_pids

    async def _is_mine(self, name: str) -> bool:
        info = await run_blocking(lambda: docker_sdk.get_engine().inspect_info(name))
        owner = info.owner if info is not None else None
        return owner is not None and self._mine(owner.host, owner.pid)

    async def create(self, req: CreateRequest) -> list[SandboxInfo]:
        _check_supported(req)
        names = [_valid(n) for n in _names(req)]
        secret_env = self._secret_values(req.secrets)
        if req.pool is not None:
            _valid(req.pool, "pool")
            await self._own_pool(req.pool)
            if req.image is not None or req.cpus is not None or req.memory_gb is not None:
                raise InvalidRequestError("image, cpus and memory_gb come from the pool: do not pass them with pool=")
        elif not req.image:
            raise InvalidRequestError("image is required unless pool= is given")
        else:
            await asyncio.to_thread(images.pull, req.image)
        await asyncio.sleep(self.knobs.pool_claim_sec if req.pool else self.knobs.cold_create_sec)
        made: list[docker_sdk.DockerSandbox] = []
        async with self._claims_of(req.pool):
            if req.pool is not None:
                ready = (await docker_sdk.get_pool.aio(req.pool)).idle
                if ready < len(names):  # all or nothing: a refused batch takes no member
                    raise PoolExhaustedError(f"pool {req.pool!r} has {ready} ready member(s) for {len(names)} claim(s)")
            try:
                for name in names:
                    made.append(await self._create_one(name, req, secret_env))
            except BaseException:
                for sandbox in made:
                    await self.terminate(sandbox.name)
                raise
        return [await self.info(sandbox.name) for sandbox in made]

    def _claims_of(self, pool: str | None) -> contextlib.AbstractAsyncContextManager[object]:
        """One claim of a pool at a time on this server, so a batch is served whole or not at all."""
        if pool is None:
            return contextlib.nullcontext()
        return self._pool_claims.setdefault(pool, asyncio.Lock())

    async def _create_one(self, name: str, req: CreateRequest, secret_env: dict[str, str]) -> docker_sdk.DockerSandbox:
        try:
            sandbox = await docker_sdk.create.aio(
                name=name,
                image=req.image,
                pool=req.pool,
                start_if_empty=False,  # a SkyPilot claim with no ready member fails
                cpus=req.cpus,
                memory_gb=req.memory_gb,
                env={**req.env, **secret_env} or None,
                block_network=req.block_network,
                timeout=req.timeout,
                registry=req.registry,
                context_name=req.context_name,
                namespace=req.namespace,
                owner=self.owner,
            )
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(str(exc)) from None
        assert isinstance(sandbox, docker_sdk.DockerSandbox)  # one at a time: no num_sandboxes here
        self._handles[name] = sandbox
        return sandbox

    async def sandbox(self, name: str) -> docker_sdk.DockerSandbox:
        """The emulator's sandbox called ``name``: cached, or found again in the engine."""
        info = await run_blocking(lambda: docker_sdk.get_engine().inspect_info(name))
        owner = info.owner if info is not None else None
        mine = owner is not None and self._mine(owner.host, owner.pid)
        if info is None or info.is_idle_member or not mine or info.is_expired():
            self._handles.pop(name, None)
            raise SandboxNotFoundError(f"sandbox {name!r} not found (terminated, expired or evicted)")
        cached = self._handles.get(name)
        if cached is None or cached.id != info.id:
            cached = self._handles[name] = await docker_sdk.get.aio(name)
        return cached

    async def info(self, name: str) -> SandboxInfo:
        for record in await self._records():
            if record.name == name:
                return _to_info(record)
        raise SandboxNotFoundError(f"sandbox {name!r} not found (terminated, expired or evicted)")

    async def ls(self) -> list[SandboxInfo]:
        return [_to_info(r) for r in await self._records()]

    async def terminate(self, name: str) -> None:
        """Idempotent, like SkyPilot's: terminating a sandbox that is gone succeeds (and one
        of another account is gone, as far as this one can tell). One evicted for its disk use
        is listed as FAILED, as Kubernetes keeps an evicted pod, until terminated."""
        self._handles.pop(name, None)
        if await self._is_mine(name) or await self._evicted_mine(name):
            await docker_sdk.terminate_by_name.aio(name)

    async def _evicted_mine(self, name: str) -> bool:
        record = await docker_sdk.evicted.aio(name)
        return record is not None and self._mine(record.owner_host, record.owner_pid)

    async def evict(self, name: str | None = None) -> str | None:
        """Remove a sandbox behind its owner's back (a lost node, a preemption); a random one
        of the live sandboxes when ``name`` is None. Returns what was evicted."""
        if name is None:
            live = [r.name for r in await self._records()]
            if not live:
                return None
            name = random.Random(self.knobs.seed + len(self.evicted)).choice(sorted(live))
        self._handles.pop(name, None)
        if await self._is_mine(name) and await docker_sdk.terminate_by_name.aio(name):
            self.evicted.append(name)
            return name
        return None

    # ── exec ──────────────────────────────────────────────────────────────────────────────

    async def exec_start(self, name: str, req: ExecRequest) -> str:
        timeout = check_exec_timeout(req.timeout_seconds)
        sandbox = await self.sandbox(name)
        try:
            run = await run_blocking(
                lambda: sandbox.launch(exec_argv(req.argv, req.workdir), None, timeout, req.env),
                on_abandon=lambda r: r.kill(),
            )
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        exec_id = uuid.uuid4().hex
        self._execs[exec_id] = run
        self._exec_sandboxes[exec_id] = name
        self._forget_old_execs()
        return exec_id

    def _forget_old_execs(self) -> None:
        while len(self._execs) > KEPT_EXEC_RESULTS:
            oldest = next(iter(self._execs))
            if not self._execs[oldest].future.done():
                break
            self._execs.popitem(last=False)
            self._exec_sandboxes.pop(oldest, None)

    def exec_sandbox(self, exec_id: str) -> str | None:
        """The sandbox an exec ran in (for the fault counts by sandbox)."""
        return self._exec_sandboxes.get(exec_id)

    async def exec_wait(self, exec_id: str) -> ExecResult:
        run = self._execs.get(exec_id)
        if run is None:
            raise LookupError(f"exec {exec_id!r} is unknown to this server (it restarted, or the id is wrong)")
        code = await asyncio.wrap_future(run.future)
        return ExecResult(
            exit_code=code,
            stdout_b64=base64.b64encode(run.stdout.value()).decode(),
            stderr_b64=base64.b64encode(run.stderr.value()).decode(),
            timed_out=run.timed_out,
        )

    # ── files and snapshots ───────────────────────────────────────────────────────────────

    async def write_bytes(self, name: str, path: str, data: bytes) -> None:
        """No implicit parent directories (SkyPilot's examples ``mkdir -p`` before a write)."""
        sandbox = await self.sandbox(name)
        await sandbox.write_bytes.aio(data, path, parents=False)

    async def read_bytes(self, name: str, path: str) -> bytes:
        sandbox = await self.sandbox(name)
        return await sandbox.read_bytes.aio(path)

    async def snapshot(self, name: str) -> str:
        sandbox = await self.sandbox(name)
        return await asyncio.to_thread(images.snapshot, sandbox.id, name, self.registry)

    async def reap_expired(self) -> int:
        """Remove this account's sandboxes past their TTL (the container's own sleep ends most
        of them). Only its own: the engine's other sandboxes (another emulator server's, the
        Docker SDK's) are not this account's to remove, whatever their TTL says."""
        now = time.time()
        expired = [
            r.name
            for r in await docker_sdk.ls.aio()
            if self._mine(r.owner_host, r.owner_pid) and r.expires_at is not None and r.expires_at <= now
        ]
        for name in expired:
            self._handles.pop(name, None)
            await docker_sdk.terminate_by_name.aio(name)
        return len(expired)


def _to_info(record: docker_sdk.SandboxRecord) -> SandboxInfo:
    return SandboxInfo(
        name=record.name,
        status=_STATUS.get(record.status, "FAILED"),
        image=record.image,
        pool=record.pool,
        created_at=record.created_at,
        expires_at=record.expires_at,
        status_message=record.status_message,
    )
