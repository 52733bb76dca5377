"""Checks of warm pools: claim, refill and resize, through SkyPilot's documented pool calls.

SkyPilot's SDK has no call that shows a pool, so a pool is observed through claims (on SkyPilot a
claim needs a ready member) and ``ls()`` (a claimed sandbox's record names its pool); an SDK that
offers a pool view (``get_pool``, the Docker SDK's) is also read through it.
"""

from __future__ import annotations

import time
from typing import Any

from osmosis_harbor.sandbox.conformance.core import (
    ConformanceContext,
    check,
    expect,
    expect_raises,
    field_of,
    poll,
)
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.errors import is_invalid

# ── pools ────────────────────────────────────────────────────────────────────────────────────


async def _idle(ctx: ConformanceContext, pool: str) -> int | None:
    """The pool's ready members where the SDK shows them (None: it has no pool view)."""
    get_pool = getattr(ctx.sdk, "get_pool", None)
    return None if get_pool is None else int(field_of(await get_pool.aio(pool), "idle"))


async def _claim(ctx: ConformanceContext, pool: str, stem: str, **kwargs: Any) -> Any | None:
    """A member of ``pool``, or None when the claim was refused (no ready member)."""
    try:
        return await ctx.new_sandbox(stem, pool=pool, **kwargs)
    except Exception:  # noqa: BLE001 - a refused claim is an answer here
        return None


async def _listed_pool(ctx: ConformanceContext, name: str) -> str | None:
    for record in await ctx.sdk.ls.aio():
        if records.name_of(record) == name:
            return records.pool_of(record)
    return None


@check(pools=True)
async def check_pool_claim_and_refill(ctx: ConformanceContext) -> str:
    """A pool claim is fast, gets the create env, is listed with its pool, and the pool refills."""
    pool = ctx.unique("pool")
    await ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    exc = await expect_raises(
        ctx.sdk.create.aio(name=ctx.unique("bad"), pool=pool, image=ctx.image, timeout=60), "image with pool"
    )
    expect(is_invalid(exc), f"image with pool raised {type(exc).__name__} ({exc}), not read as a refused request")
    started = time.monotonic()
    sandbox = await ctx.new_sandbox("claim", pool=pool, env={"SBCHK_POOL": "claimed"})
    out = await ctx.sh(sandbox, 'printf %s "$SBCHK_POOL"')
    claim_seconds = time.monotonic() - started
    expect(out.stdout == "claimed", f"claimed sandbox env {out.stdout!r}")
    listed = await _listed_pool(ctx, sandbox.name)
    expect(listed == pool, f"ls() lists the claimed sandbox with pool {listed!r}, not {pool!r}")

    async def refilled() -> bool:
        idle = await _idle(ctx, pool)
        if idle is not None:
            return idle >= 1
        return await _claim(ctx, pool, "refill") is not None

    refill_seconds = await poll(refilled, timeout=90, what="pool did not refill after a claim")
    return f"claim+first exec {claim_seconds:.2f}s, refill {refill_seconds:.2f}s"


@check(pools=True)
async def check_pool_resize(ctx: ConformanceContext) -> str:
    """set_pool_size grows the ready members (two claims are served at once); delete_pool works
    once its claimed sandboxes are gone."""
    pool = ctx.unique("resize")
    await ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    await ctx.sdk.set_pool_size.aio(pool, 2)
    idle = await _idle(ctx, pool)
    if idle is not None:
        await poll(lambda: _idle_is(ctx, pool, 2), timeout=90, what="pool did not grow to 2")
    claimed = [await _claim(ctx, pool, "grown"), await _claim(ctx, pool, "grown")]
    expect(all(c is not None for c in claimed), "a pool grown to 2 did not serve two claims")
    await ctx.sdk.set_pool_size.aio(pool, 0)
    if idle is not None:
        await poll(lambda: _idle_is(ctx, pool, 0), timeout=60, what="pool did not shrink to 0")
    for sandbox in claimed:
        assert sandbox is not None
        await sandbox.terminate.aio(wait=True)
    await ctx.sdk.delete_pool.aio(pool)
    return "1 -> 2 (two claims served) -> 0, deleted"


async def _idle_is(ctx: ConformanceContext, pool: str, n: int) -> bool:
    return await _idle(ctx, pool) == n
