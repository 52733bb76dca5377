"""One process, many rollouts in flight: the server's host cost per rollout, while waiting
and per completed rollout, with the rollout server measured from outside its process.

Why: a trainer sends thousands of rollouts per step; the sandboxes scale out, the process
that drives their trials does not (one asyncio process uses at most one core). What one
process can drive follows from what a rollout costs it: CPU per completed rollout (which
caps rollouts/s per core), CPU and memory per in-flight rollout while its workflow waits
(which caps how many it can hold), and the event loop's lag with hundreds in flight.

How: the rollout server (``HarborBackend`` behind the real osmosis server) runs in a child
process (``bench.server_proc``); this process is the controller (the osmosis client), the
scripted policy and a gate (``bench.gate``). Two phases, each with a fresh server:

* ``cpu``: a chat call plus the Osmosis grader (the template task graded in a sandbox of
  its own), ``CPU_ROLLOUTS`` rollouts at concurrency 4 after two warm-up rollouts; the
  server's utime + stime over the batch, per rollout.
* ``scale``: N rollouts submitted at once to a queue of N; each workflow's command waits at
  the gate, which holds them until all N arrived (or the ramp times out), then for an idle
  window, then opens. CPU during the window gives the idle cost per rollout-second; the
  server's CPU over the whole batch, minus that rate times the total time workflows waited
  at the gate, gives the CPU per completed rollout with the sleep excluded. RSS growth
  over the baseline after the warm-up, divided by the rollouts in flight, gives memory per
  rollout; a probe on the server's loop gives the lag while they are in flight.

Every sandbox is the child's; closing the child removes anything of its pid that is left.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_harbor.testing.scripted_policy import FakeChatServer

from . import harbor_floor
from .common import BenchResult, percentile
from .env import workdir
from .gate import Gate
from .server_proc import ServerProcess, ServerSpec
from .soak import controller
from .workload import GRADED_PROMPT, submit_rollout

NAME = "scale"
TITLE = "one server process with N rollouts in flight: host CPU, idle cost, memory, loop lag"
DEFAULT_N = 300
QUICK_N = 24
CPU_CONCURRENCY = 4
START_WINDOW = 16  # rollouts started but not yet waiting at the gate


@dataclass(frozen=True)
class Sizes:
    n: int
    cpu_rollouts: int
    idle_window_sec: float
    ramp_timeout_sec: float
    floor_trials: int = 40  # bench.harbor_floor's batch


def sizes(quick: bool, n: int | None = None) -> Sizes:
    if quick:
        return Sizes(n or QUICK_N, cpu_rollouts=8, idle_window_sec=10.0, ramp_timeout_sec=300.0, floor_trials=40)
    return Sizes(n or DEFAULT_N, cpu_rollouts=16, idle_window_sec=20.0, ramp_timeout_sec=900.0, floor_trials=200)


@dataclass
class ScaleFigures:
    """What the scale phase measured; the JSON keys the issue names are the attributes."""

    submitted: int = 0
    server_pid: int = 0
    in_flight: int = 0
    completed: int = 0
    failed: int = 0
    ramp_sec: float = 0.0
    host_cpu_per_rollout_s: float = float("nan")
    idle_cpu_ms_per_rollout_s: float = float("nan")
    rss_mib_per_rollout: float = float("nan")
    loop_lag_p99_ms: float = float("nan")
    ramp_loop_lag_p99_ms: float = float("nan")
    ceiling_rollouts_per_s: float = float("nan")
    lag_samples_ms: list[float] = field(default_factory=list)


@dataclass
class CpuFigures:
    """A graded rollout's server CPU, in all and per thread family (event loop, executors, relay)."""

    per_rollout_s: float
    per_rollout_by_thread_s: dict[str, float]


async def cpu_phase(
    work: Path, chat: FakeChatServer, rollouts: int, profile_to: Path | None = None, sdk: str = "docker"
) -> CpuFigures:
    """The server's CPU seconds per graded rollout at concurrency 4 (after two warm-ups), on a
    server process of its own."""
    spec = ServerSpec(
        Path(tempfile.mkdtemp(prefix="cpu-", dir=work)), n_concurrent=CPU_CONCURRENCY, graded=True, sdk=sdk
    )
    async with ServerProcess(spec) as server:
        return await measure_cpu(server, chat, rollouts, profile_to)


async def measure_cpu(
    server: ServerProcess, chat: FakeChatServer, rollouts: int, profile_to: Path | None = None, warm_ups: int = 2
) -> CpuFigures:
    """``cpu_phase``'s measurement on a running graded server. The tests share one with the scale
    phase's measurement (``measure_scale``) and leave the warm-ups out (``warm_ups=0``): that one
    warmed the server, and what they check is where the CPU went, not how much."""
    async with controller(server.url, rollouts + warm_ups) as client:
        for _ in range(warm_ups):
            await submit_rollout(client, chat.base_url, GRADED_PROMPT, grade=True, timeout=None)
        if profile_to is not None:
            await server.ask("profile-start")
        before, threads_before = server.cpu_sec(), await server.cpu_by_thread()
        oks = await asyncio.gather(
            *(submit_rollout(client, chat.base_url, GRADED_PROMPT, grade=True, timeout=None) for _ in range(rollouts))
        )
        spent, by_thread = server.cpu_sec() - before, await server.cpu_by_thread()
        if profile_to is not None:
            await server.ask("profile-stop", str(profile_to))
    if not all(oks):
        raise RuntimeError(f"{oks.count(False)} of {rollouts} graded rollouts failed in the cpu phase")
    grown = {name: seconds - threads_before.get(name, 0.0) for name, seconds in by_thread.items()}
    grown["(threads that ended)"] = max(0.0, spent - sum(grown.values()))
    ranked = sorted(grown.items(), key=lambda item: -item[1])
    return CpuFigures(spent / rollouts, {name: seconds / rollouts for name, seconds in ranked})


async def ramp(gate: Gate, size: Sizes, submit: Callable[[], Awaitable[bool]]) -> list[asyncio.Task[bool]]:
    """Submit N rollouts keeping at most ``START_WINDOW`` started but not yet at the gate, then
    wait until every one is at the gate or has ended (or the ramp times out).

    Why a window: 300 submitted at once start 300 sandboxes and 300 interpreters together; on
    two cores that starves the server so long that the controller's polls time out and the
    osmosis server cancels every rollout when their polling leases expire (the backend's start
    cap is the product's answer; here the driver paces itself)."""
    deadline = time.monotonic() + size.ramp_timeout_sec
    tasks: list[asyncio.Task[bool]] = []

    def settled() -> int:
        return len(gate.arrivals) + sum(t.done() for t in tasks)

    while time.monotonic() < deadline:
        if len(tasks) < size.n and len(tasks) - settled() < START_WINDOW:
            tasks.append(asyncio.create_task(submit()))
            continue
        if settled() >= size.n:
            break
        # a bounded wait on the gate's condition; the re-check also sees rollouts that ended
        await asyncio.to_thread(gate.wait_arrivals, len(gate.arrivals) + 1, 2.0)
    return tasks


async def scale_phase(work: Path, chat: FakeChatServer, size: Sizes) -> ScaleFigures:
    """N gated rollouts in flight at once through a server process of their own."""
    spec = ServerSpec(Path(tempfile.mkdtemp(prefix="scale-", dir=work)), n_concurrent=size.n)
    async with ServerProcess(spec) as server:
        return await measure_scale(server, chat, size)


async def measure_scale(server: ServerProcess, chat: FakeChatServer, size: Sizes) -> ScaleFigures:
    """``scale_phase``'s measurement on a running server whose queue holds N."""
    figures = ScaleFigures(submitted=size.n, server_pid=server.pid)
    gate = Gate()
    try:
        async with controller(server.url, size.n + 2) as client:
            await submit_rollout(client, chat.base_url, "warm up\nreply: true", grade=False, timeout=None)
            await server.ask("lag")
            cpu0, rss0, t0 = server.cpu_sec(), server.rss_mib(), time.monotonic()
            text = f"wait at the gate\nreply: {gate.command}"
            tasks = await ramp(
                gate, size, lambda: submit_rollout(client, chat.base_url, text, grade=False, timeout=1800)
            )
            figures.in_flight = len(gate.arrivals)
            figures.ramp_sec = time.monotonic() - t0
            ramp_lag = await server.ask("lag")
            cpu_a = server.cpu_sec()
            await asyncio.sleep(size.idle_window_sec)  # the measured window, not a synchronisation
            cpu_b, rss_idle = server.cpu_sec(), server.rss_mib()
            figures.lag_samples_ms = await server.ask("lag")
            gate.open()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            spent = server.cpu_sec() - cpu0
        figures.completed = sum(r is True for r in results)
        figures.failed = size.n - figures.completed
        idle_rate = (cpu_b - cpu_a) / (size.idle_window_sec * max(figures.in_flight, 1))
        figures.idle_cpu_ms_per_rollout_s = idle_rate * 1000
        figures.host_cpu_per_rollout_s = (spent - idle_rate * gate.waiting_seconds()) / size.n
        figures.rss_mib_per_rollout = (rss_idle - rss0) / max(figures.in_flight, 1)
        figures.loop_lag_p99_ms = percentile(figures.lag_samples_ms, 99)
        figures.ramp_loop_lag_p99_ms = percentile(ramp_lag, 99)
        figures.ceiling_rollouts_per_s = 1 / figures.host_cpu_per_rollout_s
    finally:
        gate.close()
    return figures


def report(result: BenchResult, figures: ScaleFigures, cpu: CpuFigures | None) -> None:
    cpu_graded = cpu.per_rollout_s if cpu else None
    result.add("host CPU per graded rollout, concurrency 4", "s", [cpu_graded] if cpu_graded else [])
    for family, seconds in (cpu.per_rollout_by_thread_s if cpu else {}).items():
        result.add(f"  of which {family}" + ("" if family.startswith("(") else " thread(s)"), "s", [seconds])
    for key in (
        "in_flight",
        "host_cpu_per_rollout_s",
        "idle_cpu_ms_per_rollout_s",
        "rss_mib_per_rollout",
        "loop_lag_p99_ms",
        "ceiling_rollouts_per_s",
    ):
        result.headline_value(key, float(getattr(figures, key)))
    result.headline_value("graded_host_cpu_per_rollout_s", cpu_graded)
    result.add(
        f"host CPU per rollout, {figures.in_flight} in flight (wait excluded)", "s", [figures.host_cpu_per_rollout_s]
    )
    result.add("idle CPU per in-flight rollout per second", "ms", [figures.idle_cpu_ms_per_rollout_s])
    result.add("RSS growth per in-flight rollout", "MiB", [figures.rss_mib_per_rollout])
    result.add("event-loop lag while in flight", "ms", figures.lag_samples_ms, "probe: a 50 ms sleep's overrun")
    result.add("event-loop lag p99 during the ramp", "ms", [figures.ramp_loop_lag_p99_ms])
    result.add("ramp: submit to all in flight", "s", [figures.ramp_sec])
    result.info.update(
        submitted=figures.submitted,
        in_flight=figures.in_flight,
        completed=figures.completed,
        failed=figures.failed,
        ceiling_rollouts_per_s=round(figures.ceiling_rollouts_per_s, 2),
    )
    if figures.in_flight < figures.submitted:
        result.warn(f"only {figures.in_flight} of {figures.submitted} rollouts were in flight at once")
    if figures.failed:
        result.warn(f"{figures.failed} rollout(s) did not succeed")


async def report_harbor_floor(result: BenchResult, trials: int) -> None:
    """Harbor's own CPU per trial on a null environment (``bench.harbor_floor``), as shipped
    (the baseline) and with our fast paths: the share of a rollout's host CPU that stays
    whatever the sandbox layer does, beside the figures above."""
    shipped = await asyncio.to_thread(harbor_floor.measure, trials, fastpaths=False)
    ours = await asyncio.to_thread(harbor_floor.measure, trials, fastpaths=True)
    base = result.add(
        "Harbor's Trial on a null environment, as shipped", "s", [float(shipped["cpu_per_trial_s"])], baseline=True
    )
    fast = result.add(
        "Harbor's Trial on a null environment, with our fast paths",
        "s",
        [float(ours["cpu_per_trial_s"])],
        f"{trials} oracle trials at concurrency {harbor_floor.CONCURRENCY}, no sandbox",
    )
    result.ratio("Harbor's Trial: with our fast paths / as shipped", fast, base)
    result.headline_value("harbor_trial_floor_cpu_s", float(ours["cpu_per_trial_s"]))


async def run(quick: bool, *, scale_n: int | None = None) -> BenchResult:
    size = sizes(quick, scale_n)
    result = BenchResult(NAME, f"{TITLE} (N={size.n})")
    work = workdir(NAME)
    chat = FakeChatServer(default_reply="true")
    try:
        cpu = await cpu_phase(work, chat, size.cpu_rollouts)
        figures = await scale_phase(work, chat, size)
        report(result, figures, cpu)
        await report_harbor_floor(result, size.floor_trials)
    finally:
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    return result
