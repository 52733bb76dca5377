"""What our code assumes of an SDK where SkyPilot's docs are silent, observed.

Each check says what it saw and whether our assumption held (``Observation``), and it passes
when our code survives what it saw either way: an empty pool's claim that is served (the Docker
SDK cold-starts one) is not what SkyPilot's examples show, but our claim path copes. It fails
where our code would not: a refusal read as "no such pool" (the claim would give up instead of
falling back), a ``create_pool`` twice refused as a bad request (prewarm could not adopt the
pool), a "not found" or a refused request our error reading (``sdk/errors.py``) does not recognise,
an ``ls()`` record we cannot terminate. One run of ``sandbox-check --sdk skypilot`` is the proof
on the real SDK.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from osmosis_harbor.sandbox.conformance.core import (
    ConformanceContext,
    Observation,
    check,
    expect,
    poll,
)
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.errors import is_api_fault, is_invalid, is_missing, meaning, status_of
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, terminate_record

# A claim that neither returns nor fails in this long is an SDK that waits for a member.
CLAIM_PATIENCE_SEC = 60.0


def _shape(exc: BaseException) -> str:
    """An error as our code reads it: class, status, meaning."""
    status = status_of(exc)
    return f"{type(exc).__name__}{f' (HTTP {status})' if status is not None else ''}, read as {meaning(exc)}"


async def _ls_pool(ctx: ConformanceContext, name: str) -> Any | None:
    for record in await ctx.sdk.ls.aio():
        if records.name_of(record) == name:
            return record
    return None


@check(pools=True, assumption="a claim from a pool with no ready member fails, and not as 'no such pool'")
async def check_assume_empty_pool_claim_fails(ctx: ConformanceContext) -> Observation:
    """A claim of an empty pool: refused (SkyPilot's examples) or served; never read as a missing pool."""
    pool = ctx.unique("empty")
    await ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=0)
    started = time.monotonic()
    try:
        claim = ctx.new_sandbox("empty-claim", pool=pool)
        served = await asyncio.wait_for(claim, CLAIM_PATIENCE_SEC)
    except TimeoutError:
        raise AssertionError(
            f"a claim of an empty pool neither returned nor failed in {CLAIM_PATIENCE_SEC:.0f}s"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the refusal is what is observed
        expect(not is_missing(exc), f"the refusal ({_shape(exc)}) reads as 'no such pool': a claim would not fall back")
        return Observation(True, f"refused after {time.monotonic() - started:.2f}s: {_shape(exc)}")
    await served.terminate.aio(wait=True)
    return Observation(False, f"served in {time.monotonic() - started:.2f}s (this SDK starts a member itself)")


@check(pools=True, assumption="create_pool of an existing name raises, and not as a refused request")
async def check_assume_create_pool_twice_raises(ctx: ConformanceContext) -> Observation:
    """create_pool twice with one shape: the second raises (SkyPilot's examples) or is idempotent."""
    pool = ctx.unique("twice")
    await ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=0)
    try:
        await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=0)
    except Exception as exc:  # noqa: BLE001 - the refusal is what is observed
        expect(not is_invalid(exc), f"the second create_pool ({_shape(exc)}) reads as a bad request: no adoption")
        return Observation(True, f"raised {_shape(exc)}; prewarm adopts the pool")
    return Observation(False, "idempotent: the second create_pool succeeded")


@check(pools=True, assumption="delete_pool fails with a 500 while a sandbox claimed from it exists")
async def check_assume_delete_pool_with_claimed_member_fails(ctx: ConformanceContext) -> Observation:
    """delete_pool with a claimed member: refused (500, retried as an API fault) or done."""
    pool = ctx.unique("busy")
    await ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    member = await ctx.new_sandbox("busy-member", pool=pool)
    try:
        await ctx.sdk.delete_pool.aio(pool)
    except Exception as exc:  # noqa: BLE001 - the refusal is what is observed
        await member.terminate.aio(wait=True)
        await ctx.sdk.delete_pool.aio(pool)  # once the member is gone it goes
        detail = f"refused: {_shape(exc)}; deleted once the member was terminated"
        return Observation(status_of(exc) == 500 and is_api_fault(exc), detail)
    out = await ctx.run(member, "true")
    return Observation(False, f"deleted with the member claimed (the member's next exec exited {out.code})")


@check(assumption="'not found' and a refused request are read as such whatever the SDK's exception shape")
async def check_assume_error_shapes(ctx: ConformanceContext) -> Observation:
    """A terminated sandbox, a missing pool, a missing file, a bad name: each read as our code needs."""
    gone = await ctx.new_sandbox("gone")
    await gone.terminate.aio(wait=True)
    seen = []
    for what, call, wanted in (
        ("exec in a terminated sandbox", _exec_code(gone), is_missing),
        (
            "a claim of a missing pool",
            ctx.sdk.create.aio(name=ctx.unique("nopool"), pool=ctx.unique("nopool")),
            is_missing,
        ),
        ("a read of a missing file", (await ctx.shared()).read_bytes.aio("/tmp/sbchk/never-written"), is_missing),
        ("a name that is not DNS-1123", ctx.sdk.create.aio(name="Not_DNS", image=ctx.image, timeout=60), is_invalid),
    ):
        try:
            outcome = await call
        except Exception as exc:  # noqa: BLE001 - the error's shape is what is observed
            expect(wanted(exc), f"{what}: {_shape(exc)}, not read as {wanted.__name__.removeprefix('is_')}")
            seen.append(f"{what}: {_shape(exc)}")
            continue
        expect(what.startswith("exec") and outcome not in (0, None), f"{what} succeeded ({outcome!r})")
        seen.append(f"{what}: exit {outcome}")
    return Observation(True, "; ".join(seen))


async def _exec_code(sandbox: Any) -> Any:
    handle = await sandbox.exec.aio("true", timeout_seconds=30)
    return await handle.wait()


@check(assumption="a missing binary or workdir exits 127")
async def check_assume_exit_127(ctx: ConformanceContext) -> Observation:
    """exec of a binary that is not there, and in a workdir that is not there: exit 127 (slime, live)."""
    sandbox = await ctx.shared()
    binary = await ctx.run(sandbox, "sbchk-no-such-binary")
    workdir = await ctx.run(sandbox, "true", workdir="/sbchk/no/such/dir")
    expect(binary.code not in (0, None) and workdir.code not in (0, None), f"exits {binary.code}, {workdir.code}")
    return Observation(
        (binary.code, workdir.code) == (127, 127), f"missing binary exit {binary.code}, missing workdir {workdir.code}"
    )


@check(assumption="ls() records carry name, status and pool, and can be terminated")
async def check_assume_ls_records_are_terminable(ctx: ConformanceContext) -> Observation:
    """A listed sandbox is found by name, live, and terminated through its record."""
    sandbox = await ctx.new_sandbox("listed")
    record = await _ls_pool(ctx, sandbox.name)
    expect(record is not None, f"{sandbox.name} is not in ls()")
    status = records.status_of(record)
    terminable = callable(getattr(getattr(record, "terminate", None), "aio", None))
    await terminate_record(ctx.sdk, record, ApiRetry.of(ctx.settings))

    async def gone() -> bool:
        return await _ls_pool(ctx, sandbox.name) is None

    await poll(gone, timeout=30, what="a sandbox terminated through its ls() record is still listed")
    how = "its own terminate()" if terminable else "the SDK's terminate_by_name"
    return Observation(terminable, f"status {status}; terminated through {how}")


@check(assumption="a write makes no missing parent directory")
async def check_assume_write_needs_its_directory(ctx: ConformanceContext) -> Observation:
    """write_bytes into a directory that does not exist: refused (SkyPilot's examples mkdir first) or made."""
    sandbox = await ctx.shared()
    path = f"/tmp/sbchk/{ctx.unique('nodir')}/file.txt"
    try:
        await sandbox.write_bytes.aio(b"x", path)
    except Exception as exc:  # noqa: BLE001 - the refusal is what is observed
        return Observation(True, f"refused: {_shape(exc)}")
    back = bytes(await sandbox.read_bytes.aio(path))
    expect(back == b"x", f"read back {back!r}")
    return Observation(False, "the parent directory was made")


@check(assumption="exec handles take wait(timeout=), and sandboxes read_text / write_text")
async def check_assume_wait_timeout_and_text_calls(ctx: ConformanceContext) -> Observation:
    """``handle.wait(timeout=)`` (slime calls it) and the text twins of the file calls."""
    sandbox = await ctx.shared()
    handle = await sandbox.exec.aio("sh", "-c", "exit 4", timeout_seconds=30)
    code = await handle.wait(timeout=30)
    expect(code == 4, f"wait(timeout=) gave {code}")
    text = callable(getattr(getattr(sandbox, "write_text", None), "aio", None))
    if text:
        await sandbox.write_text.aio("héllo", "/tmp/sbchk/text-call.txt")
        back = await sandbox.read_text.aio("/tmp/sbchk/text-call.txt")
        expect(back == "héllo", f"read_text gave {back!r}")
    return Observation(text, "wait(timeout=) ok" + ("; read_text/write_text ok" if text else "; no text calls"))
