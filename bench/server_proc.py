"""The rollout server in a process of its own, so its host cost can be read from outside.

Why: "host CPU per rollout" is the server process's CPU time (utime + stime, every thread),
which a benchmark can only read cleanly when the controller, the scripted policy and any
gate the workflows wait on live in another process. The child builds a ``HarborBackend``
exactly as ``bench.env.make_backend`` does, prewarms it, serves it with the real osmosis
server (``serve_locally``) and runs an event-loop lag probe; the parent reads CPU and RSS
from ``/proc`` and asks the child, over a pipe, for the probe's samples or a profile.

The child's sandboxes carry the child's pid as owner, so ``ServerProcess.close`` checks for
and removes that pid's leftovers (the parent's own hygiene check would not see them).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from osmosis_harbor.serving.local import serve_locally

from .env import dispose, grader_task, make_backend

LAG_PERIOD_SEC = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")
_THREAD_NUMBER = re.compile(r"[_-]\d+$")  # ThreadPoolExecutor's and asyncio's worker numbers


def make_ours(spec: ServerSpec) -> Any:
    """Our ``HarborBackend`` as ``bench.env.make_backend`` builds it, for ``spec``."""
    tasks_dir = grader_task(spec.work) if spec.graded else None
    pool = {"pool": f"bench{os.getpid()}", "pool_size": spec.pool_size} if spec.pool_size else {}
    return make_backend(
        spec.work,
        n_concurrent=spec.n_concurrent,
        grader="AnswerGrader" if spec.graded else None,
        sdk=spec.sdk,
        workers=spec.workers,
        **({"tasks_dir": tasks_dir} if tasks_dir else {}),
        **pool,
    )


@dataclass(frozen=True)
class ServerSpec:
    """What the child serves: the template task, graded by the Osmosis grader or not, with the
    backend ``make`` builds and ``dispose`` ends (module-level functions: the spec crosses a
    spawn)."""

    work: Path
    n_concurrent: int
    graded: bool = False
    sdk: str = "docker"  # ours: the sandbox SDK (docker or skypilot-emulator)
    pool_size: int = 0  # ours: > 0 claims from a warm pool of this size, made by the prewarm at start
    workers: int = 1  # ours: worker processes (``HarborBackend(workers=)``; > 1: no prewarm, it is refused)
    make: Callable[[ServerSpec], Any] = make_ours
    dispose: Callable[[Any], Awaitable[None]] = dispose


class LagProbe:
    """How late a ``sleep(LAG_PERIOD_SEC)`` wakes up on this loop: the loop's lag."""

    def __init__(self) -> None:
        self.samples_ms: list[float] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(LAG_PERIOD_SEC)
            self.samples_ms.append(max(0.0, (loop.time() - started - LAG_PERIOD_SEC) * 1000))

    def take(self) -> list[float]:
        taken, self.samples_ms = self.samples_ms, []
        return taken


class _Profiler:
    """yappi (CPU clock, every thread) when installed: cProfile sees only the loop's thread."""

    def __init__(self) -> None:
        import yappi

        self._yappi = yappi
        yappi.set_clock_type("cpu")

    def start(self) -> None:
        self._yappi.clear_stats()
        self._yappi.start(builtins=False)

    def stop(self, path: str) -> str:
        self._yappi.stop()
        self._yappi.get_func_stats().save(path, type="pstat")
        return path


async def _serve(spec: ServerSpec, conn: Connection) -> None:
    backend = spec.make(spec)
    probe = LagProbe()
    probe_task = asyncio.create_task(probe.run())
    profiler: _Profiler | None = None
    try:
        if spec.workers == 1:
            await backend.prewarm()
        async with serve_locally(backend) as url:
            conn.send(("ready", url))
            while True:
                command, arg = await asyncio.to_thread(conn.recv)
                if command == "stop":
                    break
                if command == "lag":
                    conn.send(probe.take())
                elif command == "profile-start":
                    profiler = profiler or _Profiler()
                    profiler.start()
                    conn.send(None)
                elif command == "profile-stop":
                    conn.send(profiler.stop(arg) if profiler else None)
                elif command == "threads":
                    conn.send({thread.native_id: thread.name for thread in threading.enumerate()})
    finally:
        probe_task.cancel()
        await spec.dispose(backend)


def _child(spec: ServerSpec, conn: Connection) -> None:
    try:
        asyncio.run(_serve(spec, conn))
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise
    conn.send(("stopped", None))


def _thread_cpu_sec(task: Path) -> float:
    """One thread's CPU seconds: ``schedstat``'s run time (ns) where the kernel keeps it,
    else utime + stime in clock ticks."""
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except FileNotFoundError:
        fields = _stat_fields(task / "stat")
        return (int(fields[11]) + int(fields[12])) / _TICKS


def pid_cpu_sec(pid: int) -> float | None:
    """utime + stime of a live process (all its threads); None once it has gone."""
    try:
        fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _stat_fields(stat: Path) -> list[str]:
    """A /proc ``stat`` line's fields after the command name (which may hold spaces and
    parentheses): index 11 is utime, 12 stime, 13 and 14 the waited-for children's."""
    line = stat.read_text()
    return line[line.rindex(")") + 2 :].split()


class ServerProcess:
    """``with ServerProcess(spec) as server:`` then ``server.url``, ``cpu_sec()``, ``rss_mib()``."""

    def __init__(self, spec: ServerSpec, start_timeout: float = 900.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=_child, args=(spec, child_conn), daemon=True)
        self._start_timeout = start_timeout
        self.url = ""
        self.worker_pids: list[int] = []  # its worker processes (workers > 1), whose sandboxes carry their pids
        self.removed: list[str] = []  # what closing found left behind, and removed

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    async def __aenter__(self) -> ServerProcess:
        self._process.start()
        if not await asyncio.to_thread(self._conn.poll, self._start_timeout):
            raise RuntimeError(f"the rollout server process did not start within {self._start_timeout:.0f} s")
        status, value = self._conn.recv()
        if status != "ready":
            raise RuntimeError(f"the rollout server process failed to start: {value}")
        self.url = value
        self.worker_pids = self.child_pids()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def ask(self, command: str, arg: Any = None) -> Any:
        self._conn.send((command, arg))
        return await asyncio.to_thread(self._conn.recv)

    async def close(self) -> list[str]:
        """Stop the child (its backend shuts down) and remove whatever it still owns."""
        from osmosis_harbor.sandbox import docker as docker_sdk

        if self._process.is_alive():
            self._conn.send(("stop", None))
            await asyncio.to_thread(self._process.join, 120)
        if self._process.is_alive():
            self._process.kill()
            await asyncio.to_thread(self._process.join, 10)
        for owner in (self.pid, *self.worker_pids):
            removed = await asyncio.to_thread(docker_sdk.remove_all, owner_pid=owner)
            self.removed += [r.name for r in removed]
        return list(self.removed)

    def cpu_sec(self) -> float:
        """utime + stime of the child (all its threads, and any children it waited for)."""
        fields = _stat_fields(Path(f"/proc/{self.pid}/stat"))
        return sum(int(f) for f in fields[11:15]) / _TICKS

    async def cpu_by_thread(self) -> dict[str, float]:
        """CPU seconds of each of the child's live threads, summed per thread family: the name
        ``threading`` gave it without its number (``asyncio_3`` is the event loop's default
        executor, ``osmosis-docker-sdk_2`` the Docker SDK's pool). /proc names every thread
        ``python``, so the names come from the child.

        A thread's run time comes from ``schedstat`` in nanoseconds: ``stat``'s utime + stime
        are whole clock ticks per thread, so a family of many threads that each ran under 10 ms
        (the Docker SDK's pool at low load) read as zero however much they ran together."""
        names: dict[int, str] = await self.ask("threads")
        spent: defaultdict[str, float] = defaultdict(float)
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                seconds = _thread_cpu_sec(task)
            except OSError:  # ended since the listing
                continue
            family = _THREAD_NUMBER.sub("", names.get(int(task.name), "other"))
            spent[family] += seconds
        return dict(spent)

    def child_pids(self) -> list[int]:
        """The child's own children (its worker processes, with ``workers`` > 1)."""
        found: list[int] = []
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                found += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
        return found

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")
