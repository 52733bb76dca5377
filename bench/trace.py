"""Where a rollout's time goes: every ``sky.sandbox`` call the Docker SDK serves, timed.

Harbor's environment reaches the sandbox only through the SDK surface (``create``,
``exec`` + ``wait``, ``write_bytes``, ``read_bytes``, ``terminate``), so timing those
calls splits a rollout into sandbox work (per call kind, and per kind of command for
``exec``) and host-side Python (the rest of the end-to-end time). The patch wraps the
functions in place for the duration of a ``with`` block and restores them after.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from osmosis_harbor.sandbox import docker as docker_sdk

# (needle in the command, label), first match wins; order matters.
_EXEC_LABELS: tuple[tuple[str, str], ...] = (
    ("pip install", "exec: bundle install (pip)"),
    ("-agent", "exec: workflow process"),
    ("(/tests/test.sh)", "exec: verifier tests/test.sh"),
    ("tar -czf", "exec: tar pack (download_dir)"),
    ("tar -xzf", "exec: tar unpack (upload_dir)"),
    ("rm -f /tmp/hb-", "exec: rm transfer archive"),
    ("reward.txt", "exec: clear reward files"),
    ("mkdir", "exec: mkdir"),
    ("chmod", "exec: chmod"),
    ("test -d", "exec: test -d (probe)"),
)


def exec_label(argv: tuple[str, ...]) -> str:
    command = " ".join(argv)
    for needle, label in _EXEC_LABELS:
        if needle in command:
            return label
    return f"exec: {command[:40]}"


@dataclass
class Trace:
    """Calls recorded while the patch is active: (label, seconds)."""

    calls: list[tuple[str, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, label: str, seconds: float) -> None:
        with self._lock:
            self.calls.append((label, seconds))

    def take(self) -> list[tuple[str, float]]:
        """The calls so far, and start afresh (one rollout at a time)."""
        with self._lock:
            calls, self.calls = self.calls, []
        return calls


def summarize(calls: list[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    """label -> (count, total seconds)."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for label, seconds in calls:
        out[label][0] += 1
        out[label][1] += seconds
    return {k: (int(v[0]), float(v[1])) for k, v in out.items()}


def _timed(fn: Any, label: str | Callable[..., str], trace: Trace) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            name = label(*args, **kwargs) if callable(label) else label
            trace.record(name, time.perf_counter() - started)

    return wrapper


@contextlib.contextmanager
def tracing() -> Iterator[Trace]:
    """Time every Docker SDK call made inside the block (all threads, all tasks)."""
    trace = Trace()
    sandbox_cls = docker_sdk.DockerSandbox
    saved_create = docker_sdk.create
    saved_methods = {name: sandbox_cls.__dict__[name] for name in ("write_bytes", "read_bytes", "terminate")}
    saved_aio = docker_sdk.ExecMethod.aio
    saved_wait = docker_sdk.AsyncExecHandle.wait

    def create_label(*_args: Any, pool: str | None = None, **_kwargs: Any) -> str:
        return "create (pool claim)" if pool else "create (container create+start)"

    docker_sdk.create = docker_sdk.Dual(
        _timed(saved_create._fn, create_label, trace), on_abandon=saved_create._on_abandon
    )
    for name, original in saved_methods.items():
        setattr(sandbox_cls, name, docker_sdk.Dual(_timed(original._fn, name, trace)))

    async def aio(self: Any, *argv: str, **kwargs: Any) -> Any:
        started = time.perf_counter()
        handle = await saved_aio(self, *argv, **kwargs)
        handle._bench_started = started
        handle._bench_label = exec_label(argv)
        return handle

    async def wait(self: Any) -> int:
        try:
            return await saved_wait(self)
        finally:
            started = getattr(self, "_bench_started", None)
            if started is not None:
                trace.record(self._bench_label, time.perf_counter() - started)
                self._bench_started = None

    docker_sdk.ExecMethod.aio = aio  # type: ignore[method-assign]
    docker_sdk.AsyncExecHandle.wait = wait  # type: ignore[method-assign]
    try:
        yield trace
    finally:
        docker_sdk.create = saved_create
        for name, original in saved_methods.items():
            setattr(sandbox_cls, name, original)
        docker_sdk.ExecMethod.aio = saved_aio  # type: ignore[method-assign]
        docker_sdk.AsyncExecHandle.wait = saved_wait  # type: ignore[method-assign]
