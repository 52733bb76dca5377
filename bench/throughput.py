"""Rollout throughput at a fixed concurrency, with and without a warm pool, against the
throughput of raw sandboxes at the same concurrency.

Why: a trainer submits many rollouts at once and the backend's ``TrialQueue`` runs
``C`` at a time; what matters is rollouts per second through that queue. A warm pool
moves container start-up off the critical path; the raw floor (``C`` concurrent
create + exec + terminate loops doing the same ``N`` cycles) is the most any sandboxed
scheme could reach here, so ``rollouts/s / floor rollouts/s`` is the fraction of the
engine's sandbox throughput that real rollouts achieve.

How: ``N`` trivial rollouts (``ListWorkflow``, the policy replies ``true``, no grading)
are submitted together with ``execute()`` to a backend whose queue runs ``C`` at a time;
the batch's wall time gives rollouts/s. The pooled backend is prewarmed with
``pool_size=C`` and each batch starts with a full pool (the refill during a batch is part
of the measurement). Floor, plain and pooled batches alternate within each repeat so
drift affects all three; figures are medians over the repeats.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult
from .env import POOL_PREFIX, dispose, make_backend, new_id, outcome_ok, run_rollout, workdir
from .floor import raw_batch, raw_cycle
from .trace import tracing

NAME = "throughput"
TITLE = "N rollouts at concurrency C, plain and warm-pool, vs raw sandbox throughput"


@dataclass(frozen=True)
class Sizes:
    rollouts: int
    concurrency: int
    repeats: int


def sizes(quick: bool) -> Sizes:
    return Sizes(rollouts=6, concurrency=3, repeats=2) if quick else Sizes(rollouts=12, concurrency=4, repeats=3)


@dataclass
class Batch:
    seconds: float
    ok: int
    latencies: list[float]
    environment: list[float]  # Harbor's environment phase (sandbox start or pool claim)


async def rollout_batch(backend: HarborBackend, chat_url: str, n: int, prefix: str) -> Batch:
    """Submit ``n`` rollouts at once; the backend's queue bounds the concurrency."""

    async def one() -> tuple[bool, float, float | None]:
        started = time.perf_counter()
        outcome = await run_rollout(backend, chat_url, new_id(prefix))
        timings = (outcome.result.extra_fields or {}).get("timings_sec", {})
        return outcome_ok(outcome), time.perf_counter() - started, timings.get("environment")

    started = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(n)))
    seconds = time.perf_counter() - started
    return Batch(
        seconds,
        sum(ok for ok, _, _ in results),
        [lat for _, lat, _ in results],
        [env for _, _, env in results if env is not None],
    )


async def wait_pool_full(backend: HarborBackend, size: int, timeout: float = 90.0) -> float:
    """Wait until every pool of ``backend`` has ``size`` idle members; returns the wait."""
    started = time.perf_counter()
    pools = sorted(set(backend.lifecycle.task_pools.values()))
    while time.perf_counter() - started < timeout:
        infos = [await docker_sdk.get_pool.aio(p) for p in pools]
        if all(i.idle >= size and i.starting == 0 for i in infos):
            break
        await asyncio.sleep(0.1)
    return time.perf_counter() - started


async def run(quick: bool) -> BenchResult:
    size = sizes(quick)
    n, c = size.rollouts, size.concurrency
    result = BenchResult(NAME, f"{TITLE} (N={n}, C={c})")
    work = workdir(NAME)
    chat = FakeChatServer(default_reply="true")
    plain = make_backend(work / "plain", n_concurrent=c)
    pooled = make_backend(work / "pooled", n_concurrent=c, pool=f"{POOL_PREFIX}-tp", pool_size=c)
    try:
        image = (await plain.prewarm()).groups_detail[0].image
        assert image
        report = await pooled.prewarm()
        result.info["pool"] = ", ".join(g.pool or "-" for g in report.groups_detail)
        # One-time costs of the process and of each path, outside the measurement.
        await run_rollout(plain, chat.base_url, new_id("tp-warm"))
        await run_rollout(pooled, chat.base_url, new_id("tp-warm"))
        await raw_cycle(image)

        floor_rate: list[float] = []
        plain_rate: list[float] = []
        pooled_rate: list[float] = []
        latencies: dict[str, list[float]] = {"plain": [], "pooled": []}
        environment: dict[str, list[float]] = {"plain": [], "pooled": []}
        creates: dict[str, list[float]] = {"plain": [], "pooled": []}
        calls_per_rollout: dict[str, list[float]] = {"plain": [], "pooled": []}
        refill: list[float] = []
        failed = 0
        with tracing() as trace:
            for r in range(size.repeats):
                order = ["floor", "plain", "pooled"]
                if r % 2:
                    order.reverse()
                for kind in order:
                    if kind == "floor":
                        floor_rate.append(n / await raw_batch(image, n, c))
                        continue
                    backend = plain if kind == "plain" else pooled
                    if kind == "pooled":
                        refill.append(await wait_pool_full(pooled, c))
                    trace.take()
                    batch = await rollout_batch(backend, chat.base_url, n, f"tp-{kind}")
                    calls = trace.take()
                    failed += n - batch.ok
                    (plain_rate if kind == "plain" else pooled_rate).append(batch.ok / batch.seconds)
                    latencies[kind] += batch.latencies
                    environment[kind] += batch.environment
                    creates[kind] += [sec for label, sec in calls if label.startswith("create")]
                    calls_per_rollout[kind].append(len(calls) / n)

        f_floor = result.add(f"raw floor: {c} loops of create+exec+terminate", "rollouts/s", floor_rate, baseline=True)
        f_plain = result.add("rollouts, no pool", "rollouts/s", plain_rate)
        f_pool = result.add(f"rollouts, warm pool of {c}", "rollouts/s", pooled_rate)
        result.ratio("no pool / raw floor", f_plain, f_floor)
        result.ratio("warm pool / raw floor", f_pool, f_floor)
        result.ratio("warm pool / no pool", f_pool, f_plain)
        result.add("  submit-to-result latency, no pool", "s", latencies["plain"], "includes waiting for a slot")
        result.add("  submit-to-result latency, warm pool", "s", latencies["pooled"], "includes waiting for a slot")
        result.add("  environment phase, no pool", "s", environment["plain"], "create+start, mkdir logs")
        result.add(
            "  environment phase, warm pool", "s", environment["pooled"], "claim, mkdir logs, upload environment/"
        )
        result.add("  sdk create: container create+start", "s", creates["plain"])
        result.add("  sdk create: pool claim", "s", creates["pooled"])
        result.add("  sdk calls per rollout, no pool", "calls", calls_per_rollout["plain"])
        result.add("  sdk calls per rollout, warm pool", "calls", calls_per_rollout["pooled"])
        result.add("  pool refill wait before a batch", "s", refill, "not counted in rollouts/s")
        result.info["failed rollouts"] = failed
        if failed:
            result.warn(f"{failed} rollout(s) failed; rates count successful ones only")
    finally:
        await dispose(pooled)
        await dispose(plain)
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    return result
