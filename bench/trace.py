"""Where a rollout's time goes: every ``sky.sandbox`` call the Docker SDK serves, timed.

Harbor's environment reaches the sandbox only through the SDK surface (``create``,
``exec`` + ``wait``, ``write_bytes``, ``read_bytes``, ``terminate``, ``ls``, and the
optional archive transfers ``put_archive`` / ``get_archive`` when the SDK has them), so
timing those calls splits a rollout into sandbox work (per call kind, and per kind of
command for ``exec``) and host-side Python (the rest of the end-to-end time). Each call is
kept with its start time and its sandbox, so sequences (an environment's start, its pool
claim, then that sandbox's first exec) can be read back. The patch wraps the functions in place for the
duration of a ``with`` block and restores them after.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment

# DockerSandbox methods wrapped with Dual; the archive pair only exists once the SDK offers it.
SANDBOX_METHODS: tuple[str, ...] = (
    "write_bytes",
    "read_bytes",
    "terminate",
    "put_archive",
    "get_archive",
    "stream_archive",  # get_archive written to a host file as it streams: the same round trip
)
CLAIM = "create (pool claim)"
CREATE = "create (container create+start)"

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


class Call(NamedTuple):
    """One SDK call: what it was, how long it took, when it started, on which sandbox."""

    label: str
    seconds: float
    started: float  # time.perf_counter() when the call was issued
    sandbox: str | None


@dataclass
class Trace:
    """Calls recorded while the patch is active, and when each sandbox environment started.

    Environment starts are kept apart: they are not SDK calls, only the moment a trial's
    ``SandboxEnvironment.start()`` was entered (by sandbox name), so the time from there to
    the sandbox's first exec can be measured through the environment.
    """

    calls: list[Call] = field(default_factory=list)
    env_starts: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, label: str, seconds: float, started: float, sandbox: str | None) -> None:
        with self._lock:
            self.calls.append(Call(label, seconds, started, sandbox))

    def environment_started(self, sandbox: str, started: float) -> None:
        with self._lock:
            self.env_starts[sandbox] = started

    def take(self) -> list[Call]:
        """The SDK calls so far, and start afresh (one rollout or one batch at a time)."""
        with self._lock:
            calls, self.calls = self.calls, []
        return calls

    def take_env_starts(self) -> dict[str, float]:
        """Sandbox name -> when its environment's ``start()`` was entered; and start afresh."""
        with self._lock:
            starts, self.env_starts = self.env_starts, {}
        return starts


def summarize(calls: list[Call]) -> dict[str, tuple[int, float]]:
    """label -> (count, total seconds)."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for call in calls:
        out[call.label][0] += 1
        out[call.label][1] += call.seconds
    return {k: (int(v[0]), float(v[1])) for k, v in out.items()}


def to_first_exec(calls: list[Call], label: str, env_starts: dict[str, float] | None = None) -> list[float]:
    """Per sandbox created by a ``label`` call: seconds to issuing the sandbox's first exec,
    from issuing that create, or (given ``env_starts``) from entering its environment's
    ``start()`` (what a trial waits before its sandbox is usable)."""
    created: dict[str, float] = {}
    first_exec: dict[str, float] = {}
    for call in calls:
        if call.sandbox is None:
            continue
        if call.label == label:
            created[call.sandbox] = call.started
        elif call.label.startswith("exec"):
            first_exec[call.sandbox] = min(call.started, first_exec.get(call.sandbox, call.started))
    origin = created if env_starts is None else {name: env_starts[name] for name in created if name in env_starts}
    return [first_exec[name] - started for name, started in origin.items() if name in first_exec]


def _sandbox_name(obj: Any) -> str | None:
    return getattr(obj, "name", None)


def _timed_method(fn: Any, label: str, trace: Trace) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            trace.record(label, time.perf_counter() - started, started, _sandbox_name(self))

    return wrapper


def _timed_create(fn: Any, trace: Trace) -> Any:
    def wrapper(*args: Any, pool: str | None = None, **kwargs: Any) -> Any:
        started = time.perf_counter()
        sandbox = None
        try:
            sandbox = fn(*args, pool=pool, **kwargs)
            return sandbox
        finally:
            label = CLAIM if pool else CREATE
            trace.record(label, time.perf_counter() - started, started, _sandbox_name(sandbox))

    return wrapper


def _timed_function(fn: Any, label: str, trace: Trace) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            trace.record(label, time.perf_counter() - started, started, None)

    return wrapper


@contextlib.contextmanager
def tracing() -> Iterator[Trace]:
    """Time every Docker SDK call made inside the block (all threads, all tasks)."""
    trace = Trace()
    sandbox_cls = docker_sdk.DockerSandbox
    saved_create = docker_sdk.create
    saved_ls = docker_sdk.ls
    saved_methods = {name: sandbox_cls.__dict__[name] for name in SANDBOX_METHODS if name in sandbox_cls.__dict__}
    saved_aio = docker_sdk.ExecMethod.aio
    saved_wait = docker_sdk.AsyncExecHandle.wait

    docker_sdk.create = docker_sdk.Dual(_timed_create(saved_create._fn, trace), on_abandon=saved_create._on_abandon)
    docker_sdk.ls = docker_sdk.Dual(_timed_function(saved_ls._fn, "ls", trace))
    for name, original in saved_methods.items():
        wrapped = _timed_method(original._fn, name, trace)
        setattr(sandbox_cls, name, docker_sdk.Dual(wrapped, on_abandon=original._on_abandon))

    # handle -> (label, issued at, sandbox) until its wait() records it: an exec is one call,
    # timed from launch to exit code.
    launched: weakref.WeakKeyDictionary[Any, tuple[str, float, str | None]] = weakref.WeakKeyDictionary()

    async def aio(self: Any, *argv: str, **kwargs: Any) -> Any:
        started = time.perf_counter()
        handle = await saved_aio(self, *argv, **kwargs)
        launched[handle] = (exec_label(argv), started, _sandbox_name(self._sandbox))
        return handle

    async def wait(self: Any) -> int:
        try:
            return await saved_wait(self)
        finally:
            pending = launched.pop(self, None)
            if pending is not None:
                label, started, sandbox = pending
                trace.record(label, time.perf_counter() - started, started, sandbox)

    saved_start = SandboxEnvironment.__dict__.get("start")
    inherited_start = SandboxEnvironment.start

    async def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        trace.environment_started(self.sandbox_name, time.perf_counter())
        return await inherited_start(self, *args, **kwargs)

    docker_sdk.ExecMethod.aio = aio  # type: ignore[method-assign]
    docker_sdk.AsyncExecHandle.wait = wait  # type: ignore[method-assign]
    SandboxEnvironment.start = start  # type: ignore[method-assign]
    try:
        yield trace
    finally:
        if saved_start is None:
            del SandboxEnvironment.start
        else:
            SandboxEnvironment.start = saved_start  # type: ignore[method-assign]
        docker_sdk.create = saved_create
        docker_sdk.ls = saved_ls
        for name, original in saved_methods.items():
            setattr(sandbox_cls, name, original)
        docker_sdk.ExecMethod.aio = saved_aio  # type: ignore[method-assign]
        docker_sdk.AsyncExecHandle.wait = saved_wait  # type: ignore[method-assign]
