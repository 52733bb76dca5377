"""Checks of warm pools: claim, refill and resize."""

from __future__ import annotations

import time

from osmosis_harbor.sandbox.conformance.core import (
    ConformanceContext,
    check,
    expect,
    expect_raises,
    field_of,
    poll,
)

# ── pools ────────────────────────────────────────────────────────────────────────────────────


async def _pool_counts(ctx: ConformanceContext, pool: str) -> tuple[int, int]:
    info = await ctx.sdk.get_pool.aio(pool)
    return int(field_of(info, "idle")), int(field_of(info, "claimed"))


@check(pools=True)
async def check_pool_claim_and_refill(ctx: ConformanceContext) -> str:
    """A pool claim is fast, gets the create env, and the pool refills to its size."""
    pool = ctx.unique("pool")
    ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    expect((await _pool_counts(ctx, pool))[0] >= 1, "create_pool returned before a member was idle")
    exc = await expect_raises(
        ctx.sdk.create.aio(name=ctx.unique("bad"), pool=pool, image=ctx.image, timeout=60), "image with pool"
    )
    expect(isinstance(exc, ValueError), f"image with pool raised {type(exc).__name__}, expected ValueError")
    started = time.monotonic()
    sandbox = await ctx.new_sandbox("claim", pool=pool, env={"SBCHK_POOL": "claimed"})
    out = await ctx.sh(sandbox, 'printf %s "$SBCHK_POOL"')
    claim_seconds = time.monotonic() - started
    expect(out.stdout == "claimed", f"claimed sandbox env {out.stdout!r}")

    async def refilled() -> bool:
        idle, claimed = await _pool_counts(ctx, pool)
        return idle >= 1 and claimed >= 1

    refill_seconds = await poll(refilled, timeout=90, what="pool did not refill after a claim")
    return f"claim+first exec {claim_seconds:.2f}s, refill {refill_seconds:.2f}s"


@check(pools=True)
async def check_pool_resize(ctx: ConformanceContext) -> str:
    """set_pool_size grows and shrinks the idle members; delete_pool removes them."""
    pool = ctx.unique("resize")
    ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    await ctx.sdk.set_pool_size.aio(pool, 2)

    async def idle_is(n: int) -> bool:
        return (await _pool_counts(ctx, pool))[0] == n

    await poll(lambda: idle_is(2), timeout=90, what="pool did not grow to 2")
    await ctx.sdk.set_pool_size.aio(pool, 0)
    await poll(lambda: idle_is(0), timeout=60, what="pool did not shrink to 0")
    await ctx.sdk.delete_pool.aio(pool)
    return "1 -> 2 -> 0, deleted"
