"""Rollout throughput at a fixed concurrency, with and without a warm pool, against the
throughput of raw sandboxes at the same concurrency; measured again with a simulated
network latency on every sandbox SDK call (``bench.latency``), the floor included.

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
drift affects all three; figures are medians over the repeats. The SDK calls and the
environments' ``start()`` are traced, which gives the warm-pool claim as a trial sees it:
from entering its environment's ``start()`` to issuing that sandbox's first exec (the same
for a plain create, for comparison; and from issuing ``create(pool=)``, to split it).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, field

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult
from .env import POOL_PREFIX, dispose, make_backend, new_id, outcome_ok, run_rollout, workdir
from .floor import raw_batch, raw_cycle
from .latency import DEFAULT_LATENCY_MS, injected_latency
from .trace import CLAIM, CREATE, to_first_exec, tracing

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
    pools = sorted(set(backend.prewarmed.task_pools.values()))
    while time.perf_counter() - started < timeout:
        infos = [await docker_sdk.get_pool.aio(p) for p in pools]
        if all(i.idle >= size and i.starting == 0 for i in infos):
            break
        await asyncio.sleep(0.1)
    return time.perf_counter() - started


@dataclass
class Rates:
    """What one latency setting measured: rates per repeat, and per-rollout figures."""

    floor: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    pooled: list[float] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "pooled": []})
    environment: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "pooled": []})
    creates: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "pooled": []})
    create_to_first_exec: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "pooled": []})
    start_to_first_exec: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "pooled": []})
    calls_per_rollout: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "pooled": []})
    refill: list[float] = field(default_factory=list)
    failed: int = 0


async def measure(plain: HarborBackend, pooled: HarborBackend, image: str, chat_url: str, size: Sizes) -> Rates:
    """Floor, plain and pooled batches, alternating order per repeat so drift hits all three."""
    n, c = size.rollouts, size.concurrency
    rates = Rates()
    with tracing() as trace:
        for r in range(size.repeats):
            order = ["floor", "plain", "pooled"]
            if r % 2:
                order.reverse()
            for kind in order:
                if kind == "floor":
                    rates.floor.append(n / await raw_batch(image, n, c))
                    continue
                backend = plain if kind == "plain" else pooled
                if kind == "pooled":
                    rates.refill.append(await wait_pool_full(pooled, c))
                trace.take()
                trace.take_env_starts()
                batch = await rollout_batch(backend, chat_url, n, f"tp-{kind}")
                calls = trace.take()
                starts = trace.take_env_starts()
                rates.failed += n - batch.ok
                (rates.plain if kind == "plain" else rates.pooled).append(batch.ok / batch.seconds)
                rates.latencies[kind] += batch.latencies
                rates.environment[kind] += batch.environment
                rates.creates[kind] += [call.seconds for call in calls if call.label.startswith("create")]
                label = CLAIM if kind == "pooled" else CREATE
                rates.create_to_first_exec[kind] += to_first_exec(calls, label)
                rates.start_to_first_exec[kind] += to_first_exec(calls, label, starts)
                rates.calls_per_rollout[kind].append(len(calls) / n)
    return rates


def report(result: BenchResult, rates: Rates, c: int, suffix: str) -> tuple[float, float]:
    """Add one latency setting's figures; returns (pool / no pool, claim to first exec median)."""
    f_floor = result.add(
        f"raw floor: {c} loops of create+exec+terminate{suffix}", "rollouts/s", rates.floor, baseline=True
    )
    f_plain = result.add(f"rollouts, no pool{suffix}", "rollouts/s", rates.plain)
    f_pool = result.add(f"rollouts, warm pool of {c}{suffix}", "rollouts/s", rates.pooled)
    result.ratio(f"no pool / raw floor{suffix}", f_plain, f_floor)
    result.ratio(f"warm pool / raw floor{suffix}", f_pool, f_floor)
    r_pool = result.ratio(f"warm pool / no pool{suffix}", f_pool, f_plain)
    result.add(
        f"  submit-to-result latency, no pool{suffix}", "s", rates.latencies["plain"], "includes waiting for a slot"
    )
    result.add(
        f"  submit-to-result latency, warm pool{suffix}", "s", rates.latencies["pooled"], "includes waiting for a slot"
    )
    result.add(f"  environment phase, no pool{suffix}", "s", rates.environment["plain"], "Harbor's timing")
    result.add(f"  environment phase, warm pool{suffix}", "s", rates.environment["pooled"], "Harbor's timing")
    result.add(f"  sdk create: container create+start{suffix}", "s", rates.creates["plain"])
    result.add(f"  sdk create: pool claim{suffix}", "s", rates.creates["pooled"])
    result.add(
        f"  environment start to first exec, no pool{suffix}",
        "s",
        rates.start_to_first_exec["plain"],
        "entering start() -> issuing the sandbox's first exec",
    )
    f_claim = result.add(
        f"  warm-pool claim through the environment (start to first exec){suffix}",
        "s",
        rates.start_to_first_exec["pooled"],
        "entering start() -> issuing the sandbox's first exec",
    )
    result.add(
        f"  sdk create(pool=) issued to first exec{suffix}",
        "s",
        rates.create_to_first_exec["pooled"],
        "the claim call and what follows it, without what start() does before it",
    )
    result.add(f"  sdk calls per rollout, no pool{suffix}", "calls", rates.calls_per_rollout["plain"])
    result.add(f"  sdk calls per rollout, warm pool{suffix}", "calls", rates.calls_per_rollout["pooled"])
    result.add(f"  pool refill wait before a batch{suffix}", "s", rates.refill, "not counted in rollouts/s")
    return r_pool.value, f_claim.median


async def run(quick: bool, *, latency_ms: float = DEFAULT_LATENCY_MS) -> BenchResult:
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
        report_ = await pooled.prewarm()
        result.info["pool"] = ", ".join(g.pool or "-" for g in report_.groups_detail)
        # One-time costs of the process and of each path, outside the measurement.
        await run_rollout(plain, chat.base_url, new_id("tp-warm"))
        await run_rollout(pooled, chat.base_url, new_id("tp-warm"))
        await raw_cycle(image)

        rates = await measure(plain, pooled, image, chat.base_url, size)
        rates_lat = Rates()
        if latency_ms > 0:
            with injected_latency(latency_ms):
                rates_lat = await measure(plain, pooled, image, chat.base_url, size)

        pool_ratio, claim = report(result, rates, c, "")
        result.headline_value("pool_over_plain", pool_ratio)
        result.headline_value("claim_to_first_exec_sec", claim)
        if latency_ms > 0:
            suffix = f" @{latency_ms:g}ms"
            pool_ratio, claim = report(result, rates_lat, c, suffix)
            result.headline_value("pool_over_plain_latency", pool_ratio)
            result.headline_value("claim_to_first_exec_sec_latency", claim)
            result.info["simulated latency per SDK call (ms)"] = latency_ms
            result.notes.append(
                f"@{latency_ms:g}ms: every sandbox SDK call (create/claim, exec launch, file and archive "
                "transfers, terminate, ls) waits that long first, in the SDK's thread; the floor below it too"
            )
        failed = rates.failed + rates_lat.failed
        result.info["failed rollouts"] = failed
        if failed:
            result.warn(f"{failed} rollout(s) failed; rates count successful ones only")
    finally:
        await dispose(pooled)
        await dispose(plain)
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    return result
