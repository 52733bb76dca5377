"""The raw sandbox floor: what one sandbox costs on this engine with nothing on top.

``create.aio(image)`` + one ``exec`` (``true``) + ``terminate.aio(wait=True)`` through the
same Docker ``sky.sandbox`` implementation, with the same image and network mode the
rollouts use. No rollout can be cheaper than this, so it is the baseline both the
per-rollout overhead and the throughput are divided by.
"""

from __future__ import annotations

import asyncio
import time

from osmosis_harbor.sandbox import docker as docker_sdk


async def raw_cycle(image: str) -> dict[str, float]:
    """One create + exec + terminate; seconds per step and in total."""
    t0 = time.perf_counter()
    sandbox = await docker_sdk.create.aio(image=image, host_network=True, timeout=600)
    t1 = time.perf_counter()
    try:
        handle = await sandbox.exec.aio("true")
        code = await handle.wait()
        if code != 0:
            raise RuntimeError(f"raw sandbox exec returned {code}")
        t2 = time.perf_counter()
    finally:
        t_term = time.perf_counter()
        await sandbox.terminate.aio(wait=True)
        t3 = time.perf_counter()
    return {"create": t1 - t0, "exec": t2 - t1, "terminate": t3 - t_term, "total": t3 - t0}


async def raw_batch(image: str, total: int, concurrency: int) -> float:
    """``concurrency`` loops doing ``total`` cycles between them; returns the wall seconds."""
    remaining = total

    async def loop() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await raw_cycle(image)

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return time.perf_counter() - started
