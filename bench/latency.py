"""A simulated network round trip on every sandbox SDK call of the Docker emulation.

Why: on SkyPilot every ``sky.sandbox`` call is a request to an API server, roughly
50-100 ms before the command even starts; on a local Docker engine the same call costs a
few milliseconds. So the local figures hide what the number of calls per rollout costs in
production. Adding a fixed delay to each call (and measuring the raw floor under the same
delay) shows the ratios a SkyPilot user would see.

What is delayed, once per call: ``create`` (including pool claims), each exec *launch*
(an exec is one call; its run time is the command's own), ``write_bytes``, ``read_bytes``,
``terminate``, ``ls``, and the optional archive transfers ``put_archive`` / ``get_archive``
when the SDK has them. The delay is slept in the thread that serves the call (the SDK's
executor for ``.aio`` calls), never on the event loop, like a blocking HTTP request would.
Pool management (``create_pool``, ``set_pool_size``, refills) happens on the server side
of SkyPilot and off the rollout's critical path, so it is left alone.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from osmosis_harbor.sandbox import docker as docker_sdk

DEFAULT_LATENCY_MS = 80.0
# DockerSandbox methods wrapped with Dual; the archive pair only exists once the SDK offers it.
SANDBOX_METHODS: tuple[str, ...] = (
    "write_bytes",
    "read_bytes",
    "terminate",
    "put_archive",
    "get_archive",
    "stream_archive",  # get_archive written to a host file as it streams: the same round trip
)
MODULE_CALLS: tuple[str, ...] = ("create", "ls")


def delayed(fn: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """``fn`` preceded by a blocking sleep of ``seconds`` (the request's round trip)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def injected_latency(latency_ms: float = DEFAULT_LATENCY_MS) -> Iterator[float]:
    """Delay every sandbox SDK call made inside the block by ``latency_ms``; yields seconds.

    Enter it *outside* ``trace.tracing()`` so the traced call times include the delay.
    """
    seconds = latency_ms / 1000.0
    if seconds <= 0:
        yield 0.0
        return
    sandbox_cls = docker_sdk.DockerSandbox
    saved_module = {name: getattr(docker_sdk, name) for name in MODULE_CALLS}
    saved_methods = {name: sandbox_cls.__dict__[name] for name in SANDBOX_METHODS if name in sandbox_cls.__dict__}
    saved_launch = sandbox_cls.launch
    for name, original in saved_module.items():
        setattr(docker_sdk, name, docker_sdk.Dual(delayed(original._fn, seconds), on_abandon=original._on_abandon))
    for name, original in saved_methods.items():
        setattr(sandbox_cls, name, docker_sdk.Dual(delayed(original._fn, seconds), on_abandon=original._on_abandon))
    sandbox_cls.launch = delayed(saved_launch, seconds)  # type: ignore[method-assign]
    try:
        yield seconds
    finally:
        for name, original in saved_module.items():
            setattr(docker_sdk, name, original)
        for name, original in saved_methods.items():
            setattr(sandbox_cls, name, original)
        sandbox_cls.launch = saved_launch  # type: ignore[method-assign]
