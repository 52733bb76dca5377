"""Warm pools on the host side: what prewarm, the rollout plan, the backend's lifecycle, the
environment's claim and ``cleanup`` do with pools, in one place.

A pool is per *environment group*: sandboxes are interchangeable when their image content and
resources are (``environment_group_key``). A user's ``pool="warm"`` is a base name: prewarm
creates ``warm-<group>`` (``pool_name_for``) for each group, sized ``pool_size`` (or at the
autoscaler's minimum for ``"auto"``), and every trial of that group claims from it. Every
pool goes into the owner's ledger before it is created (``owner.sandboxes.OwnedSandboxes``), so a host
that dies mid-prewarm leaves nothing the next start or ``cleanup`` cannot find.

What SkyPilot's pools do, and how this survives it (the Docker SDK is more forgiving; code here
must survive the strict one):

* a claim from a pool with no ready member fails: the claim is tried again for
  ``Settings.pool_claim_wait_sec``, then the sandbox is cold-created from the pool's image
  (`claim`); a task with no environment definition has no image of its own, so its claim fails;
* ``create_pool`` on an existing name raises, and one that did not warm in time raises with the
  pool still warming: either way the pool is adopted and resized (`create`);
* ``delete_pool`` answers 500 while sandboxes claimed from it exist: the owner's members are
  terminated first, the 500 retried, and a pool that still cannot go stays in the ledger (`delete`);
* only the documented calls are made; a pool view (``get_pool``) only where the SDK offers one,
  and ``block_network`` only where ``create_pool``'s signature has it: where it has none, a task
  without a network is served by no pool and runs cold (`unserved`, the decision prewarm, validate
  and every trial read).

The SDKs implement pools themselves; the local Docker one is ``sandbox/docker/pools.py`` and
``claims.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from osmosis_harbor.errors import ConfigError, PoolClaimError
from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.errors import is_invalid, is_missing
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, create_checked, retry_safe
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk
from osmosis_harbor.sandbox.sdk.registry import load_sandbox_sdk

__all__ = [
    "MissingPoolError",
    "ClaimRequest",
    "claim",
    "create",
    "delete",
    "environment_group_key",
    "health",
    "pool_keywords",
    "pool_name_for",
    "prewarm_size",
    "selected",
    "unserved",
]

log = logging.getLogger(__name__)

# Between two claims of a pool that could not serve one: a refill takes about a member's start.
CLAIM_RETRY_FIRST_SEC = 0.25
CLAIM_RETRY_MAX_SEC = 2.0


def environment_group_key(environment_id: str, cpus: float | None, memory_mb: int | None, no_network: bool) -> str:
    """What makes two sandboxes interchangeable: the image content and the resources."""
    raw = f"{environment_id}|{cpus}|{memory_mb}|{no_network}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def pool_name_for(base: str, group_key: str) -> str:
    """The warm pool of one environment group under a user's pool name (DNS-1123).

    ``--pool warm`` / ``pool="warm"`` is a *base* name everywhere: prewarm creates
    ``warm-<group>`` for each environment group, and every trial of that group, whoever
    runs it (a rollout, ``validate``), claims from that same pool. The name holds the group
    key, so a pool of that name has that group's shape (image content and resources)."""
    return f"{base[:40].rstrip('-')}-{group_key[:10]}"


def prewarm_size(
    requested: int | Literal["auto"] | None, configured: int | Literal["auto"] | None, auto_minimum: int
) -> tuple[int, bool]:
    """The size prewarm creates pools with, and whether the autoscaler sizes them afterwards:
    the size asked of prewarm, else the configured one, else 1; ``"auto"`` starts at the
    autoscaler's minimum (at least one member)."""
    chosen = requested if requested is not None else configured
    if chosen == "auto":
        return max(auto_minimum, 1), True
    return int(chosen or 1), False


def _takes(call: Any, parameter: str) -> bool:
    """Whether ``call``'s signature names ``parameter`` (a ``**kwargs`` does not: what it would
    do with the keyword is unknown)."""
    try:
        return parameter in inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False


_NETWORK_FLAGS = {
    "block_network": "so a member would have a network and this task must have none",
    "host_network": "so a member could not share the host's network",
}


def unserved(sdk: SandboxSdk, shape: Mapping[str, Any]) -> str | None:
    """Why this SDK's warm pools cannot hold sandboxes of ``shape`` (None: they can).

    A pool fixes its members' shape at ``create_pool``, and SkyPilot's documented signature
    (name, image, cpus, memory_gb, replicas, enable_docker) has no network option: a task that
    must have no network cannot be served by a pool there, only by a create of its own."""
    for flag, consequence in _NETWORK_FLAGS.items():
        if shape.get(flag) and not _takes(sdk.create_pool, flag):
            return f"create_pool takes no {flag}=, {consequence}"
    return None


def pool_keywords(sdk: SandboxSdk, name: str, shape: dict[str, Any]) -> dict[str, Any]:
    """``shape`` as ``create_pool`` keywords this SDK takes. A shape its pools cannot hold
    (`unserved`) is refused: saying so beats a pool whose members have a network."""
    reason = unserved(sdk, shape)
    if reason is not None:
        raise ConfigError(f"warm pool {name!r}: this SDK's {reason}; run this task without a pool (--pool)")
    keywords = {key: value for key, value in shape.items() if key not in _NETWORK_FLAGS}
    keywords.update({flag: True for flag in _NETWORK_FLAGS if shape.get(flag)})
    return keywords


async def create(
    sandboxes: OwnedSandboxes, sdk_name: str, name: str, image: str, size: int, shape: dict[str, Any]
) -> str | None:
    """Create the pool ``name`` of ``image`` at ``size``, in the owner's ledger before the SDK is
    asked (``shape``: cpus, memory, network, from the group's environment). A pool that exists
    (the name holds the group's shape) is adopted and resized, and one still warming is usable:
    returns a note saying so, or None for a pool made and warm."""
    sdk = load_sandbox_sdk(sdk_name)
    keywords = pool_keywords(sdk, name, shape)
    await sandboxes.pool_pending(name, sdk_name)
    try:
        await sdk.create_pool.aio(name, image, replicas=size, **keywords)
    except Exception as exc:
        if is_invalid(exc):  # refused: a resize cannot fix it
            raise
        note = await _adopt(sdk, name, size, exc, sandboxes.retry)
        await sandboxes.pool_made(name, sdk_name)
        return note
    await sandboxes.pool_made(name, sdk_name)
    return None


async def _adopt(sdk: SandboxSdk, name: str, size: int, failure: Exception, retry: ApiRetry) -> str:
    """``create_pool`` failed: the pool exists, or did not warm in time. Resized to ``size``
    it is this group's pool; if there is no such pool, ``failure`` stands."""
    log.info("create_pool %s failed (%s): adopting the pool at size %d", name, failure, size)
    try:
        await retry_safe("set_pool_size", retry, sdk.set_pool_size.aio, name, size)
    except Exception as exc:
        if is_missing(exc):
            raise failure from exc
        log.warning("pool %s is not yet fully warm (%s): claims wait for it or fall back", name, exc)
        return f"adopted, still warming: {_one_line(exc)}"
    return f"adopted the existing pool ({_one_line(failure)})"


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300]


@dataclass(frozen=True)
class ClaimRequest:
    """One sandbox to claim from ``pool``: ``common`` are the create keywords (``name`` among
    them); ``attempt`` makes one claim call (batched or not, in a start slot); ``fallback``, a
    cold create of the pool's image (None for a generic pool, whose image is not ours to know);
    ``base``: the user's pool name, for the remedy when the pool does not exist; ``wait_sec``:
    how long a pool that cannot serve is asked again (``Settings.pool_claim_wait_sec``)."""

    sdk: SandboxSdk
    pool: str
    name: str
    attempt: Callable[[], Awaitable[Any]]
    fallback: Callable[[], Awaitable[Any]] | None
    base: str | None
    generic: bool
    wait_sec: float
    retry: ApiRetry


class MissingPoolError(LookupError):
    """The pool a claim named does not exist (``generic``: it was the named pool itself)."""

    def __init__(self, message: str, *, generic: bool) -> None:
        super().__init__(message)
        self.generic = generic


def _missing_pool(request: ClaimRequest, exc: Exception) -> MissingPoolError:
    if request.generic:
        return MissingPoolError(
            f"warm pool {request.pool!r} does not exist: a task with no environment definition "
            f"runs only from an existing pool with a generic image ({exc})",
            generic=True,
        )
    return MissingPoolError(
        f"warm pool {request.pool!r} (pool {request.base!r} for this task's environment group) "
        f"does not exist, nor does a pool named {request.base!r}: create it first with "
        f"`python -m osmosis_harbor prewarm <tasks> --pool {request.base}`, or run without --pool ({exc})",
        generic=False,
    )


async def claim(request: ClaimRequest) -> tuple[Any, bool]:
    """A member of the pool for ``request.name``, and whether it had to be cold-created instead.

    A claim the pool cannot serve (no ready member; the refusal's shape is SkyPilot's own, so
    anything but "no such pool") is tried again until ``request.wait_sec`` has passed, then
    the sandbox is cold-created from the pool's image: a burst larger than the warm pool runs,
    slower, instead of failing. Each call goes through ``create_checked``: a call that faulted
    and made a sandbox anyway is terminated before the next."""
    deadline = time.monotonic() + request.wait_sec
    delay = CLAIM_RETRY_FIRST_SEC
    while True:
        try:
            return await create_checked(request.sdk, request.name, request.attempt, request.retry), False
        except Exception as exc:
            if is_missing(exc):
                raise _missing_pool(request, exc) from None
            last = exc
        if time.monotonic() + delay > deadline:
            break
        await asyncio.sleep(delay)  # backoff between claims, not a synchronisation
        delay = min(delay * 2, CLAIM_RETRY_MAX_SEC)
    if request.fallback is None:
        raise PoolClaimError(
            f"warm pool {request.pool!r} could not serve a claim for "
            f"{request.wait_sec:g}s ({_one_line(last)}), and a task with no environment "
            "definition has no image to cold-create from: make the pool larger"
        ) from last
    log.info(
        "pool %s could not serve %s (%s): cold-creating it from the pool's image", request.pool, request.name, last
    )
    return await create_checked(request.sdk, request.name, request.fallback, request.retry), True


async def delete(sandboxes: OwnedSandboxes, sdk_name: str, pools: Iterable[str]) -> list[str]:
    """Delete ``pools`` and close them in the ledger; returns what could not be deleted, one line
    each. A pool another live owner uses (the ledger's pool users: pool names are shared warm
    capacity) is left to it, this owner's use released. SkyPilot refuses (500) while a sandbox claimed from a pool exists, so the owner's own
    members (and dead owners') are terminated first and the 500 is retried; a pool that still
    cannot be deleted (a live owner's sandbox holds it) stays in the ledger, marked, for the
    next start or ``cleanup``."""
    names = sorted(set(pools))
    if not names:
        return []
    sdk = load_sandbox_sdk(sdk_name)
    problems = []
    for pool in names:
        if await sandboxes.pool_shared(pool, sdk_name):
            log.info("pool %s is still used by another live owner: left to it", pool)
            continue
        try:
            await _end_members(sandboxes, sdk, sdk_name, pool)
            await retry_safe("delete_pool", sandboxes.retry, sdk.delete_pool.aio, pool)
        except Exception as exc:
            if not is_missing(exc):
                problems.append(f"pool {pool}: {exc}")
                await sandboxes.pool_delete_failed(pool, sdk_name, _one_line(exc))
                continue
        await sandboxes.pool_gone(pool, sdk_name)
    return problems


async def _end_members(sandboxes: OwnedSandboxes, sdk: SandboxSdk, sdk_name: str, pool: str) -> None:
    """Terminate the sandboxes claimed from ``pool`` that are this owner's or a dead owner's."""
    for record in await retry_safe("ls", sandboxes.retry, sdk.ls.aio):
        if records.pool_of(record) == pool:
            with contextlib.suppress(Exception):  # the delete's 500 then says it is still there
                await sandboxes.end_if_ours(sdk, sdk_name, record)


def health(sdk_name: str, pools: Iterable[str]) -> dict[str, Any]:
    """Each pool's replicas, idle and claimed members where the SDK offers a pool view
    (``get_pool``: the Docker SDK; SkyPilot's SDK has none); an ``error`` entry when it does
    not answer (health must answer all the same)."""
    names = sorted(set(pools))
    if not names:
        return {}
    state: dict[str, Any] = {}
    try:
        sdk = load_sandbox_sdk(sdk_name)
        get_pool = getattr(sdk, "get_pool", None)
        if get_pool is None:
            return {pool: {"state": "not reported by this SDK"} for pool in names}
        for pool in names:
            info = get_pool(pool)
            state[pool] = {"replicas": info.replicas, "idle": info.idle, "claimed": info.claimed}
    except Exception as exc:
        state["error"] = str(exc)
    return state


def selected(names: Iterable[str], prefixes: Sequence[str] | None, *, everything: bool) -> list[str]:
    """The pools ``cleanup`` deletes: those named by a ``--pool`` prefix, or all of them."""
    return [name for name in names if everything or any(name.startswith(prefix) for prefix in prefixes or [])]
