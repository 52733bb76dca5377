"""Admission: host memory per queued rollout with thousands queued, and how fast a full
queue says no (HTTP 429).

Why: a trainer may submit far more rollouts than there are sandbox slots. Queued
rollouts must cost little host memory and no sandbox, and once the queue is full the
server must refuse quickly (a slow 429 ties up the controller). Baselines measured in
the same run: for memory, an asyncio task parked on an event holding its
``ExecutionRequest`` (the least any in-process queue can hold per request); for the 429,
``GET /health`` on the same server.

How: a backend whose ``TrialQueue`` has ``n_concurrent=1`` runs one ``SleepyWorkflow``
rollout (one sandbox); then N ``execute()`` tasks are started and measured once every
one has submitted its trial (each waits for the queue's slot, holding no sandbox).
Memory is the tracemalloc and RSS delta over those N. The 429 latency is measured through
the real osmosis server with ``max_queue_depth=1`` and the queue full, first at depth 1,
then with the N rollouts queued (``has_capacity`` and ``/health`` walk every state).
Everything is then cancelled with ``cancel_rollouts(all=True)`` and the backend shut
down; any container this process still owns is reported as a leak.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.serving.local import serve_locally as serve
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult
from .env import API_KEY, dispose, make_backend, managed_containers, request, run_rollout, workdir

NAME = "admission"
TITLE = "memory per queued rollout, and 429 latency of a full queue"
PAGE = os.sysconf("SC_PAGE_SIZE")
LONG = 1800.0  # agent timeout of the running/queued rollouts: they must outlive the benchmark


@dataclass(frozen=True)
class Sizes:
    queued: int
    requests: int


def sizes(quick: bool) -> Sizes:
    return Sizes(queued=2000, requests=100) if quick else Sizes(queued=10_000, requests=200)


def memory() -> tuple[int, int]:
    """(tracemalloc current bytes, RSS bytes) after a full collection."""
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * PAGE
    return traced, rss


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


def body(rollout_id: str, chat_url: str) -> dict:
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": "go"}],
        "chat_completions_url": chat_url,
        "llm_api_key": API_KEY,
        "grade": False,
        "agent_timeout_sec": LONG,
    }


def http_latencies(url: str, chat_url: str, count: int, tag: str) -> tuple[list[float], list[float], list[str]]:
    """From a client thread: ``count`` POST /rollout (expected 429) interleaved with GET /health (ms)."""
    refused: list[float] = []
    health: list[float] = []
    unexpected: list[str] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(5):  # connection set-up and first-request costs
            client.get("/health")
            client.post("/rollout", json=body(f"warm-{tag}-{i}", chat_url))
        for i in range(count):
            payload = body(f"rej-{tag}-{i}", chat_url)
            started = time.perf_counter()
            response = client.post("/rollout", json=payload)
            refused.append((time.perf_counter() - started) * 1000)
            if response.status_code != 429:
                unexpected.append(f"POST /rollout -> {response.status_code}")
            started = time.perf_counter()
            response = client.get("/health")
            health.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                unexpected.append(f"GET /health -> {response.status_code}")
    return refused, health, unexpected


async def parked_baseline(n: int) -> tuple[float, float]:
    """Bytes per asyncio task parked on an event while holding its request (traced, RSS)."""
    gate = asyncio.Event()

    async def park(req: object) -> object:
        await gate.wait()
        return req

    tracemalloc.start()
    try:
        t0, r0 = memory()
        tasks = [asyncio.create_task(park(request(f"park-{i:05d}"))) for i in range(n)]
        await asyncio.sleep(0)
        t1, r1 = memory()
    finally:
        tracemalloc.stop()
    gate.set()
    await asyncio.gather(*tasks)
    return (t1 - t0) / n, (r1 - r0) / n


def disk_usage(root: Path) -> tuple[int, int]:
    """(bytes, files) under ``root``."""
    total = files = 0
    for path in root.rglob("*"):
        if path.is_file():
            files += 1
            total += path.stat().st_size
    return total, files


async def run(quick: bool) -> BenchResult:
    size = sizes(quick)
    n, m = size.queued, size.requests
    result = BenchResult(NAME, f"{TITLE} (N={n:,} queued, {m} requests per latency figure)")
    work = workdir(NAME)
    chat = FakeChatServer(default_reply="true")
    backend: HarborBackend = make_backend(work, agent="SleepyWorkflow", n_concurrent=1)
    tasks: list[asyncio.Task] = []
    running: asyncio.Task | None = None
    try:
        await backend.prewarm()
        running = asyncio.create_task(run_rollout(backend, chat.base_url, "adm-running", agent_timeout_sec=LONG))
        await wait_for(
            lambda: (backend.rollout_status("adm-running") or {}).get("status") == RolloutStatus.RUNNING,
            180,
            "the running rollout",
        )
        async with serve(backend) as url:
            async with httpx.AsyncClient(base_url=url) as http:
                queued = await http.post("/rollout", json=body("adm-http-queued", chat.base_url))
            if queued.status_code != 202:
                result.warn(f"queueing one rollout through the server answered {queued.status_code}")
            backend.max_queue_depth = 1  # the queue (1 waiting) is now full
            refused1, health1, bad1 = await asyncio.to_thread(http_latencies, url, chat.base_url, m, "d1")

            per_task_traced, per_task_rss = await parked_baseline(n)

            tracemalloc.start()
            before = tracemalloc.take_snapshot()
            traced0, rss0 = memory()
            started = time.perf_counter()
            ids = [f"adm-q-{i:05d}" for i in range(n)]
            tasks = [
                asyncio.create_task(run_rollout(backend, chat.base_url, rid, agent_timeout_sec=LONG)) for rid in ids
            ]

            def submitted() -> bool:
                states = (backend.tracker.get(rid) for rid in ids)
                return (
                    sum(1 for s in states if s is not None and s.task is not None) + sum(t.done() for t in tasks) >= n
                )

            await wait_for(submitted, 600, f"{n} rollouts to reach the queue")
            admit_sec = time.perf_counter() - started
            traced1, rss1 = memory()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            early = [t for t in tasks if t.done()]
            sandboxes_while_queued = len(managed_containers(os.getpid()))
            rollouts_root = backend.workspace.root / "rollouts"  # per-rollout task copies (private layout)
            disk_bytes, disk_files = disk_usage(rollouts_root)
            counts = backend.tracker.counts()

            refused_n, health_n, bad_n = await asyncio.to_thread(http_latencies, url, chat.base_url, m, "dn")

            cancel_started = time.perf_counter()
            dispositions = backend.cancel_rollouts(all=True)
            _, pending = await asyncio.wait([*tasks, running], timeout=300)
            cancel_sec = time.perf_counter() - cancel_started
        # leaving serve() drains the server and calls backend.shutdown()
        leaked = managed_containers(os.getpid())

        f_traced = result.add(
            "host memory per queued rollout (tracemalloc)",
            "KiB",
            [(traced1 - traced0) / n / 1024],
            "Python allocations held",
        )
        f_park = result.add(
            "parked asyncio task + request (tracemalloc)", "KiB", [per_task_traced / 1024], baseline=True
        )
        result.ratio("queued rollout / parked task (tracemalloc)", f_traced, f_park)
        f_rss = result.add("host memory per queued rollout (RSS)", "KiB", [(rss1 - rss0) / n / 1024])
        f_prss = result.add("parked asyncio task + request (RSS)", "KiB", [per_task_rss / 1024], baseline=True)
        result.ratio("queued rollout / parked task (RSS)", f_rss, f_prss)
        result.add(
            "disk per queued rollout (task copy)", "KiB", [disk_bytes / n / 1024], f"{disk_files / n:.0f} files each"
        )
        result.add("admission rate (execute() to queued)", "rollouts/s", [n / admit_sec], "under tracemalloc (slower)")
        f_r1 = result.add("429 at queue depth 1: POST /rollout", "ms", refused1)
        f_h1 = result.add("GET /health at queue depth 1", "ms", health1, baseline=True)
        result.ratio("429 / health at depth 1", f_r1, f_h1)
        f_rn = result.add(f"429 at queue depth {n + 1:,}: POST /rollout", "ms", refused_n)
        f_hn = result.add(f"GET /health at queue depth {n + 1:,}", "ms", health_n, baseline=True)
        result.ratio(f"429 / health at depth {n + 1:,}", f_rn, f_hn)
        result.ratio(f"429 at depth {n + 1:,} / 429 at depth 1", f_rn, f_r1)
        result.add(f"cancel all {n + 2:,} + wait until every execute() returned", "s", [cancel_sec])

        result.info["queued (tracker) while measuring"] = counts["queued"]
        result.info["sandboxes while queued (expected 1: the running rollout)"] = sandboxes_while_queued
        kinds = list(dispositions.values())
        result.info["cancel dispositions"] = (
            f"{kinds.count('cancelled_queued')} queued, {kinds.count('cancelled_running')} running"
        )
        result.info["containers left after cancel + shutdown (expected 0)"] = len(leaked)
        top = sorted(after.compare_to(before, "filename"), key=lambda s: -s.size_diff)[:6]
        for stat in top:
            where = stat.traceback[0].filename.replace(str(Path.home()), "~")
            short = where.split("site-packages/")[-1] if "site-packages/" in where else where.split("/")[-1]
            result.notes.append(f"memory per queued rollout: {stat.size_diff / n / 1024:6.2f} KiB  {short}")
        if sandboxes_while_queued != 1:
            result.warn(f"{sandboxes_while_queued} sandboxes while {n} rollouts were queued (expected 1)")
        if early:
            first = early[0]
            why = "cancelled" if first.cancelled() else (first.exception() or first.result().result.err_message)
            result.warn(f"{len(early)} rollout(s) finished before being queued, e.g. {why}")
        for problem in (bad1 + bad_n)[:3]:
            result.warn(f"unexpected HTTP answer: {problem}")
        if pending:
            result.warn(f"{len(pending)} execute() task(s) still pending after cancel")
        if leaked:
            result.warn(f"LEAK: {len(leaked)} container(s) left after cancel + shutdown")
    finally:
        for task in [*tasks, *([running] if running else [])]:
            task.cancel()
        await asyncio.gather(*tasks, *([running] if running else []), return_exceptions=True)
        await dispose(backend)
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    return result
