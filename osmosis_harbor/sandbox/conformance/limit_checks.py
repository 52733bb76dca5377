"""Checks of the bounds a sandbox really gets: cgroup memory, pids and CPU, and /tmp."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from osmosis_harbor.sandbox.conformance.core import (
    ConformanceContext,
    check,
    expect,
)

# ── limits ───────────────────────────────────────────────────────────────────────────────────

BOUNDS_SCRIPT = r"""
cg=/sys/fs/cgroup
rd() { cat "$1" 2>/dev/null || echo none; }
if [ -f $cg/memory.max ]; then
  echo "memory $(rd $cg/memory.max)"; echo "pids $(rd $cg/pids.max)"; echo "cpu $(rd $cg/cpu.max)"
else
  echo "memory $(rd $cg/memory/memory.limit_in_bytes)"; echo "pids $(rd $cg/pids/pids.max)"
  echo "cpu $(rd $cg/cpu/cpu.cfs_quota_us) $(rd $cg/cpu/cpu.cfs_period_us)"
fi
echo "tmp $(df -Pk /tmp | tail -n 1)"
echo "root $(df -Pk / | tail -n 1)"
"""
_UNLIMITED_MEMORY = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2^63
SMALL_MEMORY_GB = 0.25  # the hog and the /tmp fill run in a sandbox this small: seconds, not minutes


class Bounds(BaseModel):
    """The limits a sandbox really has, read back from inside it (None: unbounded)."""

    memory_bytes: int | None
    pids: int | None
    cpus: float | None
    tmp_kb: int
    tmp_mount: str
    root_kb: int
    root_fs: str

    @property
    def tmp_bounded(self) -> bool:
        """/tmp is its own filesystem, smaller than the one under /."""
        return self.tmp_mount == "/tmp" and self.tmp_kb < self.root_kb

    def unbounded(self) -> list[str]:
        gone = [
            what
            for what, value in (("memory", self.memory_bytes), ("pids", self.pids), ("cpu", self.cpus))
            if value is None
        ]
        if not self.tmp_bounded:
            gone.append("/tmp (on the same filesystem as /)")
        return gone

    def describe(self) -> str:
        memory = _gib(self.memory_bytes) if self.memory_bytes else "unbounded"
        unbounded = self.unbounded()
        return (
            f"memory {memory}, pids {self.pids or 'unbounded'}, cpus {self.cpus or 'unbounded'}, "
            f"/tmp {_gib(self.tmp_kb * 1024) if self.tmp_bounded else 'unbounded'}; "
            f"not bounded: {'; '.join(unbounded) if unbounded else 'nothing of these'}; the writable layer "
            f"(/: {self.root_fs}, {_gib(self.root_kb * 1024)} shown) cannot be read from inside: bounded "
            "outside the sandbox if at all (local SDKs: OSMOSIS_HARBOR_SANDBOX_DISK_MB and _INODES; SkyPilot: the pod's "
            "ephemeral-storage limit)"
        )


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024**3:.2f} GiB"


def _int_or_none(text: str) -> int | None:
    return int(text) if text.strip().lstrip("-").isdigit() and int(text) >= 0 else None


def parse_bounds(text: str) -> Bounds:
    lines = {k: v for k, _, v in (ln.partition(" ") for ln in text.splitlines() if ln.strip())}
    memory = _int_or_none(lines.get("memory", ""))
    cpu = lines.get("cpu", "").split()
    quota, period = (_int_or_none(cpu[0]), _int_or_none(cpu[1])) if len(cpu) == 2 else (None, None)
    tmp, root = lines.get("tmp", "").split(), lines.get("root", "").split()
    expect(len(tmp) == 6 and len(root) == 6, f"could not read df output: {text!r}")
    return Bounds(
        memory_bytes=memory if memory is not None and memory < _UNLIMITED_MEMORY else None,
        pids=_int_or_none(lines.get("pids", "")),
        cpus=round(quota / period, 2) if quota and period else None,
        tmp_kb=int(tmp[1]),
        tmp_mount=tmp[5],
        root_kb=int(root[1]),
        root_fs=root[0],
    )


async def read_bounds(ctx: ConformanceContext, sandbox: Any) -> Bounds:
    out = await ctx.sh(sandbox, BOUNDS_SCRIPT)
    expect(out.code == 0, f"reading the bounds failed (exit {out.code}): {out.stderr[:200]}")
    return parse_bounds(out.stdout)


@check()
async def check_bounds(ctx: ConformanceContext) -> str:
    """A sandbox created without resources still has memory, pid and CPU bounds (read back)."""
    bounds = await read_bounds(ctx, await ctx.shared())
    missing = [
        what
        for what, value in (("memory", bounds.memory_bytes), ("pids", bounds.pids), ("cpu", bounds.cpus))
        if value is None
    ]
    expect(not missing, f"no {', '.join(missing)} limit: {bounds.describe()}")
    return bounds.describe()


@check()
async def check_pid_limit_contains_fork_bomb(ctx: ConformanceContext) -> str:
    """A fork bomb stops at the pid limit (and the sandbox is discarded after)."""
    sandbox = await ctx.new_sandbox("pids")
    pids = (await read_bounds(ctx, sandbox)).pids
    expect(pids is not None, "no pid limit (pids.max is 'max'): a fork bomb would fill the node's pid table")
    assert pids is not None
    bomb = f"n=0; while [ $n -lt {pids + 64} ]; do sleep 60 </dev/null >/dev/null 2>&1 & n=$((n+1)); echo $n; done"
    try:
        out = await ctx.sh(sandbox, bomb, timeout=120)
    finally:
        await sandbox.terminate.aio(wait=True)
    counts = [int(line) for line in out.stdout.split() if line.isdigit()]
    spawned = counts[-1] if counts else 0
    expect(out.code != 0 and spawned < pids, f"spawned {spawned} processes (exit {out.code}), pids.max {pids}")
    return f"fork bomb stopped after {spawned} processes (pids.max {pids}) in {out.seconds:.1f}s"


@check()
async def check_memory_limit_kills_hog(ctx: ConformanceContext) -> str:
    """A process allocating past the memory limit is killed; the sandbox itself survives."""
    sandbox = await ctx.new_sandbox("mem", memory_gb=SMALL_MEMORY_GB)
    limit = (await read_bounds(ctx, sandbox)).memory_bytes
    expect(limit is not None, f"memory_gb={SMALL_MEMORY_GB} gave no memory limit inside the sandbox")
    hog = await ctx.sh(sandbox, "tail /dev/zero", timeout=120)  # buffers a line that never ends
    expect(hog.code not in (0, None, 124), f"the memory hog exited {hog.code} (expected a kill, 137)")
    alive = await ctx.run(sandbox, "true")
    expect(alive.code == 0, f"the sandbox did not survive the OOM kill of one process (exit {alive.code})")
    return f"hog killed (exit {hog.code}) at the {_gib(limit)} limit in {hog.seconds:.1f}s; sandbox still runs"


@check()
async def check_tmp_bound_refuses_writes(ctx: ConformanceContext) -> str:
    """Writing past the /tmp bound fails with 'No space left' instead of filling the host disk."""
    sandbox = await ctx.new_sandbox("tmpfill", memory_gb=SMALL_MEMORY_GB)
    bounds = await read_bounds(ctx, sandbox)
    expect(bounds.tmp_bounded, f"/tmp is not bounded ({bounds.tmp_mount} on {bounds.root_fs}): {bounds.describe()}")
    size = bounds.tmp_kb * 1024
    fill = await ctx.sh(sandbox, f"head -c {size + (1 << 20)} /dev/zero > /tmp/sbchk-fill", timeout=120)
    await ctx.run(sandbox, "rm", "-f", "/tmp/sbchk-fill")
    expect(
        fill.code != 0 and "No space left" in fill.stderr,
        f"writing {_gib(size + (1 << 20))} into a {_gib(size)} /tmp: exit {fill.code}, {fill.stderr[:200]!r}",
    )
    return f"/tmp {_gib(size)}: the write past it failed with ENOSPC in {fill.seconds:.1f}s"
