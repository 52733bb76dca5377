"""The SkyPilot path on the skypilot-emulator: its floor, its calls, and warm pool against cold create.

Why: on SkyPilot every ``sky.sandbox`` call is a request to an API server, there is no archive
capability (Harbor's own transfer path: write, unpack exec, rm exec per directory), images come
by registry reference, and a cold create waits on scheduling and the image pull while a pool
claim is sub-second. The Docker figures hide all four. This benchmark starts its own emulator
server (an ephemeral loopback port, the given per-call latency, ``--cold-create-sec`` and
``--pool-claim-sec``), pushes the sandbox image to the local registry, and measures:

- the emulator's floor: ``create(image)`` + one exec + ``terminate``, its seconds and the API
  calls it takes (the server's own count, ``/admin/stats``);
- warm pool against cold create: ``N`` cycles at concurrency ``C`` creating from the image,
  then claiming from a pool of ``C`` replicas; throughput of each and their ratio;
- calls per trivial and graded rollout without archives, and their overhead over the floor
  (``bench.emulator_rollouts``): a rollout's loopback chat endpoint reaches an emulator sandbox
  through the policy relay (the registration's ``relays_host_endpoint``); without it they are
  reported as not measured, and why.

Every sandbox, pool and server it makes is removed before it returns (``EmulatorRun.close``).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from osmosis_harbor.sandbox.sdk.errors import is_missing
from osmosis_harbor.sandbox.sdk.registry import implementation

from .common import BenchResult
from .emulator_rollouts import measure_rollouts
from .emulator_server import EMULATOR, EmulatorRun, start_emulator
from .floor import raw_cycle

NAME = "emulator"
TITLE = "the SkyPilot path on the skypilot-emulator: floor, calls without archives, warm pool vs cold create"
SANDBOX_IMAGE = os.environ.get("OSMOSIS_HARBOR_TEST_IMAGE", "debian:trixie-slim")
DEFAULT_COLD_CREATE_SEC = 2.0
DEFAULT_POOL_CLAIM_SEC = 0.3


@dataclass(frozen=True)
class Sizes:
    floor: int
    cycles: int
    concurrency: int
    rollouts: int


def sizes(quick: bool, smallest: bool = False) -> Sizes:
    if smallest:  # the hygiene test: one of each
        return Sizes(floor=1, cycles=2, concurrency=1, rollouts=1)
    if quick:
        return Sizes(floor=2, cycles=6, concurrency=3, rollouts=2)
    return Sizes(floor=5, cycles=12, concurrency=4, rollouts=5)


async def _cycle(run: EmulatorRun, image: str | None, pool: str | None) -> float:
    """One create (from ``image``, or a claim from ``pool``) + ``true`` + terminate; seconds."""
    sky = run.sdk
    started = time.perf_counter()
    if pool is None:
        sandbox = await sky.create.aio(image=image, timeout=600)
    else:
        sandbox = await _claim(run, pool)
    try:
        handle = await sandbox.exec.aio("true")
        if await handle.wait() != 0:
            raise RuntimeError(f"exec in {sandbox.name} failed")
    finally:
        await sandbox.terminate.aio()
    return time.perf_counter() - started


async def _claim(run: EmulatorRun, pool: str, patience_sec: float = 60.0) -> Any:
    """A claim from ``pool``, tried again while the pool has no ready member (SkyPilot's claims
    fail then): the wait for a refill is part of what a warm pool costs."""
    deadline = time.monotonic() + patience_sec
    while True:
        try:
            return await run.sdk.create.aio(pool=pool, timeout=600)
        except Exception as exc:
            if is_missing(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)  # backoff between claims


async def _batch(run: EmulatorRun, total: int, concurrency: int, image: str | None, pool: str | None) -> float:
    """``concurrency`` loops doing ``total`` cycles between them; returns the wall seconds."""
    remaining = total

    async def loop() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await _cycle(run, image, pool)

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return time.perf_counter() - started


async def measure_floor(result: BenchResult, run: EmulatorRun, size: Sizes) -> None:
    seconds, calls = [], []
    for _ in range(size.floor):
        before = run.calls()
        seconds.append(await _cycle(run, run.image, None))
        calls.append(run.calls() - before)
    floor = result.add(
        "floor: create + exec + terminate", "s", seconds, "cold create, image by reference", baseline=True
    )
    result.add("floor: API calls per cycle", "calls", calls)
    docker = [(await raw_cycle(SANDBOX_IMAGE))["total"] for _ in range(size.floor)]
    docker_floor = result.add("Docker floor, same image, same run", "s", docker, "the Docker SDK, no API server")
    ratio = result.ratio("emulator floor / Docker floor", floor, docker_floor, "latency and create time included")
    result.headline_value("emulator_floor_sec", floor.median)
    result.headline_value("emulator_floor_calls", max(calls))
    result.headline_value("emulator_floor_over_docker", ratio.value)
    run.floor = floor


async def measure_pool(result: BenchResult, run: EmulatorRun, size: Sizes) -> None:
    cold = await _batch(run, size.cycles, size.concurrency, run.image, None)
    pool = f"bench{os.getpid()}-emu-{uuid.uuid4().hex[:4]}"
    await run.sdk.create_pool.aio(pool, run.image, replicas=size.concurrency)
    run.pools.append(pool)
    await run.pool_full(pool, size.concurrency)
    warm = await _batch(run, size.cycles, size.concurrency, None, pool)
    cold_rate = result.add(f"cold create: cycles/s at C={size.concurrency}", "1/s", [size.cycles / cold])
    warm_rate = result.add(f"warm pool: cycles/s at C={size.concurrency}", "1/s", [size.cycles / warm])
    ratio = result.ratio("warm pool / cold create throughput", warm_rate, cold_rate, "target ≥ 1.5")
    result.headline_value("emulator_pool_over_cold", ratio.value)


async def run(
    quick: bool,
    *,
    latency_ms: float = 80.0,
    cold_create_sec: float = DEFAULT_COLD_CREATE_SEC,
    pool_claim_sec: float = DEFAULT_POOL_CLAIM_SEC,
    smallest: bool = False,
) -> BenchResult:
    size = sizes(quick, smallest)
    result = BenchResult(NAME, TITLE)
    result.info["knobs"] = (
        f"latency {latency_ms:g} ms, cold create {cold_create_sec:g} s, pool claim {pool_claim_sec:g} s"
    )
    emulator = await asyncio.to_thread(start_emulator, SANDBOX_IMAGE, latency_ms, cold_create_sec, pool_claim_sec)
    try:
        result.info["server"] = emulator.url
        result.info["server pid"] = emulator.process.pid
        result.info["image (pulled by reference)"] = emulator.image
        result.info["archive capability"] = emulator.has_archives()
        await measure_floor(result, emulator, size)
        await measure_pool(result, emulator, size)
        if getattr(implementation(EMULATOR), "relays_host_endpoint", False):
            await measure_rollouts(result, emulator, size.rollouts)
        else:  # a SkyPilot sandbox reaches no loopback endpoint without the policy relay
            result.info["rollouts"] = "not measured: no policy relay registered for the emulator"
        result.info["API calls by route"] = emulator.routes()
        for kind in ("trivial", "graded"):
            by_route = result.info.get(f"{kind} rollout: calls by route (last one)")
            if by_route:
                result.notes.append(
                    f"{kind} rollout, calls by route: " + ", ".join(f"{k} {v}" for k, v in by_route.items())
                )
    finally:
        problems = await asyncio.to_thread(emulator.close)
        result.info["left behind by the emulator run"] = len(problems)
        for problem in problems:
            result.warn(problem)
    return result
