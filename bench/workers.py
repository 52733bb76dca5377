"""``HarborBackend(workers=N)``: what the front process costs per rollout, what all processes
cost together, completions per second at 1 and N workers, and the front's loop with many in
flight.

Why: one asyncio process caps a rollout server at one core. With workers the server's process
(the front) only admits, routes and relays status; the trials' host work runs in the workers.
The claims to measure: the front's CPU per rollout is small (target at most 0.015 s, so one
front serves 60 or more completions per second), the work moved out is not multiplied (total
CPU across processes at most 1.2x one process's), and the front's loop stays responsive with
many rollouts in flight (lag p99 at most 50 ms).

How: the rollout server runs in a child process (``bench.server_proc``), with ``workers=1`` (the
single-process baseline) and ``workers=N``; its worker processes are the child's children, whose
CPU is read from ``/proc`` while they live. Each ``throughput`` phase runs ``M`` rollouts of a
sleeping workflow (``sleep`` in the sandbox) at concurrency ``M`` after one warm-up per worker,
and reads the front's and the workers' CPU over the batch. The ``in_flight`` phase holds N
rollouts in flight through the front (1,000 by default), ``SANDBOXES`` of them in sandboxes at the
gate (``bench.gate``) and the rest queued in the workers, reads the front loop's lag probe while
they wait, then cancels them all. ``--quick`` holds fewer (it says how many). At the smallest size
(the tests' ``--smallest``) the in-flight phase runs on the N-worker throughput phase's server, after
its batch, not on a server of its own.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from osmosis_ai.rollout.client import RolloutClient

from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult, percentile
from .env import new_id, workdir
from .gate import Gate
from .server_proc import ServerProcess, ServerSpec, pid_cpu_sec
from .soak import controllers
from .workload import submit_rollout

NAME = "workers"
TITLE = "HarborBackend(workers=N): front CPU, total CPU, completions per second, the front's loop"
DEFAULT_WORKERS = 2
SLEEP_SEC = 2
# How many of the in-flight phase's rollouts run in sandboxes at once; the rest wait in the workers'
# queues. A thousand sandboxes, each holding its workflow's Python, do not fit a 2-core, 24 GiB
# machine, and a training step is larger than its sandbox budget anyway.
SANDBOXES = 32


@dataclass(frozen=True)
class WorkerSizes:
    rollouts: int  # per throughput phase
    in_flight: int
    idle_window_sec: float
    ramp_timeout_sec: float
    # The in-flight phase on the N-worker throughput phase's server, after its batch, instead of a
    # server of its own: at the smallest size (the tests) the two servers would be alike anyway.
    one_server: bool = False


def sizes(quick: bool, smallest: bool = False, in_flight: int | None = None) -> WorkerSizes:
    if smallest:
        return WorkerSizes(
            rollouts=1, in_flight=in_flight or 2, idle_window_sec=1.0, ramp_timeout_sec=240.0, one_server=True
        )
    if quick:
        return WorkerSizes(rollouts=16, in_flight=in_flight or 24, idle_window_sec=5.0, ramp_timeout_sec=600.0)
    return WorkerSizes(rollouts=48, in_flight=in_flight or 1000, idle_window_sec=10.0, ramp_timeout_sec=3600.0)


@dataclass
class Throughput:
    workers: int
    rollouts: int
    ok: int
    wall_sec: float
    front_cpu_sec: float
    worker_cpu_sec: float
    left: list[str]  # sandboxes the server's processes left (removed on close)

    @property
    def completions_per_s(self) -> float:
        return self.ok / self.wall_sec if self.wall_sec > 0 else float("nan")

    @property
    def front_per_rollout(self) -> float:
        return self.front_cpu_sec / self.rollouts

    @property
    def total_per_rollout(self) -> float:
        return (self.front_cpu_sec + self.worker_cpu_sec) / self.rollouts


def _workers_cpu(server: ServerProcess) -> dict[int, float]:
    return {pid: cpu for pid in server.child_pids() if (cpu := pid_cpu_sec(pid)) is not None}


async def throughput_phase(work: Path, chat: FakeChatServer, workers: int, rollouts: int) -> Throughput:
    """``rollouts`` sleeping rollouts at once through a server of ``workers`` workers."""
    work = Path(tempfile.mkdtemp(prefix=f"workers{workers}-", dir=work))
    spec = ServerSpec(work, n_concurrent=max(rollouts, workers), workers=workers)
    server = ServerProcess(spec)
    async with server:
        phase = await measure_throughput(server, chat, workers, rollouts)
    phase.left = server.removed
    return phase


async def measure_throughput(server: ServerProcess, chat: FakeChatServer, workers: int, rollouts: int) -> Throughput:
    """``throughput_phase``'s batch on a running server of ``workers`` workers (what it left is
    known once the server has closed)."""
    text = f"sleep\nreply: sleep {SLEEP_SEC}"
    warm = "warm up\nreply: true"
    async with controllers(server.url, rollouts + workers) as clients:
        # the first builds the task's image; then one per worker at once (least-loaded routing
        # gives each worker one): every worker's first rollout pays its imports before the batch
        await submit_rollout(clients[0], chat.base_url, warm, grade=False, timeout=None)
        await asyncio.gather(
            *(submit_rollout(clients[0], chat.base_url, warm, grade=False, timeout=None) for _ in range(workers))
        )
        front0, workers0, t0 = server.cpu_sec(), _workers_cpu(server), time.monotonic()
        oks = await asyncio.gather(
            *(
                submit_rollout(clients[i % len(clients)], chat.base_url, text, grade=False, timeout=None)
                for i in range(rollouts)
            )
        )
        wall = time.monotonic() - t0
        front1, workers1 = server.cpu_sec(), _workers_cpu(server)
    worker_cpu = sum(cpu - workers0.get(pid, 0.0) for pid, cpu in workers1.items())
    return Throughput(workers, rollouts, sum(oks), wall, front1 - front0, worker_cpu, [])


def _running(size: WorkerSizes, workers: int) -> int:
    """How many of the in-flight phase's rollouts run in sandboxes at once (its ``n_concurrent``)."""
    return min(size.in_flight, max(SANDBOXES, workers))


async def in_flight_phase(
    work: Path, chat: FakeChatServer, workers: int, size: WorkerSizes
) -> tuple[int, float, list[str]]:
    """``hold_in_flight`` on a server of its own; with what that server left behind."""
    spec = ServerSpec(
        Path(tempfile.mkdtemp(prefix="inflight-", dir=work)), n_concurrent=_running(size, workers), workers=workers
    )
    server = ServerProcess(spec)
    async with server:
        held, lag_p99 = await hold_in_flight(server, chat, workers, size)
    return held, lag_p99, server.removed


async def throughput_then_in_flight(
    work: Path, chat: FakeChatServer, workers: int, size: WorkerSizes
) -> tuple[Throughput, tuple[int, float, list[str]]]:
    """The N-worker throughput batch, then the in-flight phase, on one server (``one_server``):
    the in-flight phase's own warm-up is left out, the batch's warmed every worker."""
    running = _running(size, workers)
    spec = ServerSpec(
        Path(tempfile.mkdtemp(prefix=f"workers{workers}-", dir=work)),
        n_concurrent=max(size.rollouts, workers, running),
        workers=workers,
    )
    server = ServerProcess(spec)
    async with server:
        phase = await measure_throughput(server, chat, workers, size.rollouts)
        held, lag_p99 = await hold_in_flight(server, chat, workers, size, warm_up=False)
    return phase, (held, lag_p99, server.removed)


async def hold_in_flight(
    server: ServerProcess, chat: FakeChatServer, workers: int, size: WorkerSizes, warm_up: bool = True
) -> tuple[int, float]:
    """N rollouts in flight through a front of ``workers`` workers, as a training step larger than
    its sandbox budget is: ``SANDBOXES`` of them running in sandboxes held at the gate, the rest
    admitted and waiting in the workers' queues (``n_concurrent`` is the budget). Returns how many
    the front held in flight at once (its ``/health``) and the front loop's lag p99 while they all
    were. Then every one is cancelled with one ``POST /rollout/cancel`` naming them all (each
    routed to its worker, queued and running alike) and its result read."""
    gate = Gate()
    running = _running(size, workers)
    try:
        async with controllers(server.url, size.in_flight + 2) as clients:
            if warm_up:
                await submit_rollout(clients[0], chat.base_url, "warm up\nreply: true", grade=False, timeout=None)
            text = f"wait at the gate\nreply: {gate.command}"
            ids = [new_id("inflight") for _ in range(size.in_flight)]
            rollouts = [
                asyncio.create_task(held_rollout(clients[i % len(clients)], chat.base_url, text, rid))
                for i, rid in enumerate(ids)
            ]
            held = await _all_in_flight(clients[0], gate, running, size)
            await server.ask("lag")
            await asyncio.sleep(size.idle_window_sec)  # the measured window, not a synchronisation
            lag = await server.ask("lag")
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:  # one call, as a trainer ends a step
                cancelled = await http.post("/rollout/cancel", json={"ids": ids})
                cancelled.raise_for_status()
            gate.open()
            await asyncio.gather(*rollouts, return_exceptions=True)
    finally:
        gate.close()
    return held, percentile(lag, 99)


async def held_rollout(client: RolloutClient, chat_url: str, text: str, rollout_id: str) -> str:
    """One ungraded rollout of ``text``, admitted and polled (an unpolled one loses its lease) until
    its result; its status."""
    handle = await client.run_rollout_async(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=chat_url,
        rollout_id=rollout_id,
        llm_api_key="sk-bench-not-a-secret",
        grade=False,
        agent_timeout_sec=3600,
    )
    return (await handle.wait_for_completion()).status.value


async def _all_in_flight(client: RolloutClient, gate: Gate, running: int, size: WorkerSizes) -> int:
    """Wait until ``running`` rollouts are at the gate and the front holds all N in flight (or the
    ramp times out); how many it held then."""
    deadline = time.monotonic() + size.ramp_timeout_sec
    in_flight = 0
    while time.monotonic() < deadline:
        in_flight = int((await client.health()).get("in_flight", 0))
        if len(gate.arrivals) >= running and in_flight >= size.in_flight:
            break
        await asyncio.to_thread(gate.wait_arrivals, len(gate.arrivals) + 1, 2.0)  # bounded: re-reads health
    return in_flight


async def run(
    quick: bool, *, smallest: bool = False, workers: int = DEFAULT_WORKERS, scale_n: int | None = None
) -> BenchResult:
    """``scale_n`` (``--scale-n``): how many the in-flight phase holds (default 1,000; 24 quick)."""
    size = sizes(quick, smallest, scale_n)
    counts = sorted({1, 2, workers})
    result = BenchResult(NAME, f"{TITLE} (N={workers})")
    work = workdir(NAME)
    chat = FakeChatServer(default_reply="true")
    try:
        phases: dict[int, Throughput] = {}
        for n in counts:
            if n == workers and size.one_server:
                phases[n], (held, lag_p99, left) = await throughput_then_in_flight(work, chat, n, size)
            else:
                phases[n] = await throughput_phase(work, chat, n, size.rollouts)
        if not size.one_server:
            held, lag_p99, left = await in_flight_phase(work, chat, workers, size)
    finally:
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    single, multi = phases[1], phases[workers]
    for n, phase in phases.items():
        result.add(f"completions per second, workers={n} (sleep {SLEEP_SEC} s)", "/s", [phase.completions_per_s])
        result.add(f"  front CPU per rollout, workers={n}", "s", [phase.front_per_rollout])
        result.add(f"  all processes' CPU per rollout, workers={n}", "s", [phase.total_per_rollout])
        if phase.ok < phase.rollouts:
            result.warn(f"workers={n}: {phase.rollouts - phase.ok} of {phase.rollouts} rollouts did not succeed")
    result.add(
        f"front loop lag p99, {held} in flight ({min(held, SANDBOXES)} in sandboxes), workers={workers}",
        "ms",
        [lag_p99],
    )
    result.headline_value("front_cpu_per_rollout_s", multi.front_per_rollout)
    result.headline_value("total_cpu_per_rollout_s", multi.total_per_rollout)
    result.headline_value("single_process_cpu_per_rollout_s", single.total_per_rollout)
    result.headline_value("total_over_single", multi.total_per_rollout / single.total_per_rollout)
    result.headline_value("in_flight", float(held))
    result.headline_value("front_loop_lag_p99_ms", lag_p99)
    for n, phase in phases.items():
        result.headline_value(f"completions_per_s_{n}", phase.completions_per_s)
    # the object the issue names, keyed by worker count (the JSON's "workers" key lifts it)
    result.headline["completions_per_s"] = {str(n): round(p.completions_per_s, 3) for n, p in phases.items()}
    left = left + [name for phase in phases.values() for name in phase.left]
    result.info.update(
        workers=workers,
        rollouts_per_phase=size.rollouts,
        in_flight_asked=size.in_flight,
        in_flight_in_sandboxes=min(size.in_flight, SANDBOXES),
        server_leftovers=len(left),
    )
    if left:
        result.warn(f"the servers left (now removed): {', '.join(left)}")
    if held < 1000:
        result.notes.append(f"{held} rollouts in flight, not the 1,000 of the full run (--quick or --smallest)")
    if held < size.in_flight:
        result.warn(f"only {held} of {size.in_flight} rollouts were in flight at once")
    return result
