"""Warm pools on the host side: one home for what prewarm, the rollout plan, the backend's
lifecycle, the environment's claim and ``cleanup`` each did with pools on their own.

A pool is per *environment group*: sandboxes are interchangeable when their image content and
resources are (``environment_group_key``). A user's ``pool="warm"`` is a base name: prewarm
creates ``warm-<group>`` (``pool_name_for``) for each group, sized ``pool_size`` (or at the
autoscaler's minimum for ``"auto"``), and every trial of that group claims from it. Every
pool goes into the owner's ledger before it is created (``live.LiveSandboxes``), so a host
that dies mid-prewarm leaves nothing the next start or ``cleanup`` cannot find.

The SDKs implement pools themselves; the local Docker one is ``sandbox/docker/pools.py`` and
``claims.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from osmosis_harbor.sandbox.api_faults import retry_safe
from osmosis_harbor.sandbox.batching import ClaimBatcher
from osmosis_harbor.sandbox.live import LiveSandboxes
from osmosis_harbor.sandbox.protocol import SandboxSdk
from osmosis_harbor.sandbox.registry import load_sandbox_sdk

__all__ = [
    "claim",
    "create",
    "delete",
    "environment_group_key",
    "health",
    "pool_name_for",
    "prewarm_size",
    "selected",
]


def environment_group_key(environment_id: str, cpus: float | None, memory_mb: int | None, no_network: bool) -> str:
    """What makes two sandboxes interchangeable: the image content and the resources."""
    raw = f"{environment_id}|{cpus}|{memory_mb}|{no_network}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def pool_name_for(base: str, group_key: str) -> str:
    """The warm pool of one environment group under a user's pool name (DNS-1123).

    ``--pool warm`` / ``pool="warm"`` is a *base* name everywhere: prewarm creates
    ``warm-<group>`` for each environment group, and every trial of that group, whoever
    runs it (a rollout, ``validate``), claims from that same pool."""
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


async def create(
    sandboxes: LiveSandboxes, sdk_name: str, name: str, image: str, size: int, shape: dict[str, Any]
) -> None:
    """Create (or resize to ``size``) the pool ``name`` of ``image``, in the owner's ledger
    before the SDK is asked (``shape``: cpus, memory, network, from the group's environment)."""
    sdk = load_sandbox_sdk(sdk_name)
    await sandboxes.pool_pending(name, sdk_name)
    await sdk.create_pool.aio(name, image, replicas=size, **shape)
    await sandboxes.pool_made(name, sdk_name)
    await sdk.set_pool_size.aio(name, size)


async def claim(
    sdk: SandboxSdk,
    pool: str,
    name: str,
    common: dict[str, Any],
    batches: ClaimBatcher | None,
    *,
    base: str | None,
    generic: bool,
) -> Any:
    """Claim one member of ``pool`` for the sandbox ``name`` (``common``: the create keywords,
    ``name`` among them; batched when the submitter batches
    claims). A missing pool is named with its remedy: prewarm for a group pool (``base`` is the
    user's pool name), an existing generic pool for a task with no environment definition."""
    try:
        if batches is not None:
            unnamed = {k: v for k, v in common.items() if k != "name"}
            return await batches.claim(sdk, pool, name, unnamed)
        return await sdk.create.aio(pool=pool, **common)
    except LookupError as exc:  # the SDK's "no such pool"
        if generic:
            raise LookupError(
                f"warm pool {pool!r} does not exist: a task with no environment definition "
                f"runs only from an existing pool with a generic image ({exc})"
            ) from None
        raise LookupError(
            f"warm pool {pool!r} (pool {base!r} for this task's environment group) "
            f"does not exist: create it first with `python -m osmosis_harbor prewarm <tasks> "
            f"--pool {base}`, or run without --pool ({exc})"
        ) from None


async def delete(sandboxes: LiveSandboxes, sdk_name: str, pools: Iterable[str]) -> list[str]:
    """Delete ``pools`` (retried on API faults) and close them in the ledger; returns what
    could not be deleted, one line each (those stay in the ledger for the next sweep)."""
    names = sorted(set(pools))
    if not names:
        return []
    sdk = load_sandbox_sdk(sdk_name)
    problems = []
    for pool in names:
        try:
            await retry_safe("delete_pool", sdk.delete_pool.aio, pool)
            await sandboxes.pool_gone(pool, sdk_name)
        except Exception as exc:
            problems.append(f"pool {pool}: {exc}")
    return problems


def health(sdk_name: str, pools: Iterable[str]) -> dict[str, Any]:
    """Each pool's replicas, idle and claimed members; an ``error`` entry when the pool API
    does not answer (health must answer all the same)."""
    names = sorted(set(pools))
    if not names:
        return {}
    state: dict[str, Any] = {}
    try:
        sdk = load_sandbox_sdk(sdk_name)
        for pool in names:
            info = sdk.get_pool(pool)
            state[pool] = {"replicas": info.replicas, "idle": info.idle, "claimed": info.claimed}
    except Exception as exc:
        state["error"] = str(exc)
    return state


def selected(names: Iterable[str], prefixes: Sequence[str] | None, *, everything: bool) -> list[str]:
    """The pools ``cleanup`` deletes: those named by a ``--pool`` prefix, or all of them."""
    return [name for name in names if everything or any(name.startswith(prefix) for prefix in prefixes or [])]
