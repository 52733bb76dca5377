"""Checks of a sandbox's life: listing, loss, termination, names, networks, the blocking API."""

from __future__ import annotations

import asyncio
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
from osmosis_harbor.sandbox.sdk.errors import is_invalid, meaning
from osmosis_harbor.sandbox.sdk.liveness import sandbox_state

# ── lifecycle ────────────────────────────────────────────────────────────────────────────────


async def _listed(ctx: ConformanceContext, name: str) -> Any | None:
    for record in await ctx.sdk.ls.aio():
        if field_of(record, "name") == name:
            return record
    return None


@check()
async def check_ls_lists_sandbox(ctx: ConformanceContext) -> str:
    """ls() reports a live sandbox with its name."""
    sandbox = await ctx.shared()
    record = await _listed(ctx, sandbox.name)
    expect(record is not None, f"{sandbox.name} missing from ls()")
    state = await sandbox_state(ctx.sdk, sandbox.name)
    expect(state.live, f"ls() reports status {state.status!r} for a running sandbox (liveness.LIVE_STATUSES)")
    return f"status {field_of(record, 'status')}"


@check()
async def check_lost_sandbox_is_seen(ctx: ConformanceContext) -> str:
    """A sandbox removed under a running command: the command ends, and ls() no longer calls it live.

    This is what tells a lost sandbox from a failing workflow (liveness.py)."""
    sandbox = await ctx.new_sandbox("lost")
    handle = await sandbox.exec.aio("sleep", "300", timeout_seconds=600)
    await sandbox.terminate.aio(wait=True)  # the only removal every implementation offers
    started = time.monotonic()
    try:
        code: Any = await asyncio.wait_for(handle.wait(), 30)
    except TimeoutError:
        raise AssertionError("a command kept waiting 30s after its sandbox was removed") from None
    except Exception as exc:  # noqa: BLE001 - raising is a valid way to end
        code = type(exc).__name__
    expect(code != 0, "a command reported success although its sandbox was removed under it")
    state = await sandbox_state(ctx.sdk, sandbox.name)
    expect(not state.live, f"ls() still reports the removed sandbox as {state.status!r}")
    return f"command ended with {code} after {time.monotonic() - started:.2f}s; ls status {state.status}"


@check()
async def check_terminate_idempotent(ctx: ConformanceContext) -> str:
    """terminate twice is fine; afterwards exec fails and ls() no longer lists the sandbox."""
    sandbox = await ctx.new_sandbox("term")
    await sandbox.terminate.aio(wait=True)
    await sandbox.terminate.aio(wait=True)
    try:
        out = await ctx.run(sandbox, "true")
        expect(out.code not in (0, None), "exec on a terminated sandbox succeeded")
        after = f"exec exit {out.code}"
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - raising is the expected outcome
        after = f"exec raised {type(exc).__name__}"

    async def gone() -> bool:
        return await _listed(ctx, sandbox.name) is None

    await poll(gone, timeout=30, what="terminated sandbox still listed")
    return after


@check()
async def check_duplicate_name_rejected(ctx: ConformanceContext) -> str:
    """A second live sandbox with the same name is refused."""
    sandbox = await ctx.shared()
    exc = await expect_raises(ctx.sdk.create.aio(name=sandbox.name, image=ctx.image, timeout=60), "duplicate name")
    return type(exc).__name__


@check()
async def check_invalid_name_rejected(ctx: ConformanceContext) -> str:
    """Names that are not DNS-1123 (uppercase, underscore, > 53 chars) are refused requests."""
    for bad in ("Upper-Case", "under_score", "x" * 54, "-leading"):
        exc = await expect_raises(ctx.sdk.create.aio(name=bad, image=ctx.image, timeout=60), f"name {bad!r}")
        expect(is_invalid(exc), f"name {bad!r} raised {type(exc).__name__}, read as {meaning(exc)}")
    return "ok"


@check()
async def check_block_network(ctx: ConformanceContext) -> str:
    """block_network leaves no usable network (only loopback, or at least no default route)."""
    sandbox = await ctx.new_sandbox("nonet", block_network=True)
    dev = await ctx.run(sandbox, "cat", "/proc/net/dev")
    interfaces = sorted(line.split(":", 1)[0].strip() for line in dev.stdout.splitlines()[2:] if ":" in line)
    route = await ctx.run(sandbox, "cat", "/proc/net/route")
    default_routes = [ln for ln in route.stdout.splitlines()[1:] if ln.split()[1:2] == ["00000000"]]
    only_lo = interfaces == ["lo"]
    expect(only_lo or not default_routes, f"interfaces {interfaces}, default routes {default_routes}")
    return f"interfaces {interfaces}"


@check()
async def check_default_network_has_interface(ctx: ConformanceContext) -> str:
    """Without block_network the sandbox has a non-loopback interface (it is not isolated)."""
    dev = await ctx.run(await ctx.shared(), "cat", "/proc/net/dev")
    interfaces = [line.split(":", 1)[0].strip() for line in dev.stdout.splitlines()[2:] if ":" in line]
    expect(any(i != "lo" for i in interfaces), f"only {interfaces}")
    return f"interfaces {sorted(interfaces)}"


@check()
async def check_sync_api(ctx: ConformanceContext) -> str:
    """The blocking twins (create, exec + wait, write/read, terminate) work from a thread."""
    sdk, image, name = ctx.sdk, ctx.image, ctx.unique("sync")

    def flow() -> str:
        sandbox = sdk.create(name=name, image=image, timeout=300)
        try:
            handle = sandbox.exec("sh", "-c", "echo sync; exit 5")
            code = handle.wait()
            stdout = handle.stdout.read()
            sandbox.write_bytes(b"sync-bytes", "/tmp/sync.bin")  # /tmp exists in every image
            data = bytes(sandbox.read_bytes("/tmp/sync.bin"))
        finally:
            sandbox.terminate(wait=True)
        expect((code, stdout) == (5, "sync\n"), f"sync exec gave {code} {stdout!r}")
        expect(data == b"sync-bytes", f"sync read {data!r}")
        return "ok"

    return await asyncio.to_thread(flow)
