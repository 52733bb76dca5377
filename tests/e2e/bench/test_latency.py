"""The benchmark's simulated SkyPilot round trip (bench/latency.py) and its SDK call trace
(bench/trace.py), on a real Docker sandbox.

The latency figures of ``python -m bench`` are only honest if every sandbox SDK call waits
exactly once, in the thread serving it (never on the event loop, which would also stall
the other rollouts), and if the trace sees each call with its sandbox. Nothing here
measures speed: the delay is observed through the sleeps themselves.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType

import pytest

from bench import latency
from bench.latency import injected_latency
from bench.trace import CREATE, to_first_exec, tracing
from osmosis_harbor.sandbox.docker import DockerSandbox

LATENCY_MS = 37.0  # an unusual value, so the injected sleeps are told apart from any other


def _patched_surface(sdk: ModuleType) -> list[object]:
    names = ("write_bytes", "read_bytes", "terminate", "put_archive", "get_archive")
    return [sdk.create, sdk.ls, DockerSandbox.launch, *(DockerSandbox.__dict__.get(n) for n in names)]


async def test_each_sdk_call_waits_once_off_the_event_loop_and_is_traced_with_its_sandbox(
    docker_sandbox_sdk: ModuleType, sandbox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdk = docker_sandbox_sdk
    before = _patched_surface(sdk)
    loop_thread = threading.get_ident()
    real_sleep = time.sleep
    injected: list[int] = []  # the thread of each injected sleep

    def recording_sleep(seconds: float) -> None:
        if seconds == LATENCY_MS / 1000:
            injected.append(threading.get_ident())
        real_sleep(seconds)

    monkeypatch.setattr(latency.time, "sleep", recording_sleep)
    with injected_latency(LATENCY_MS), tracing() as trace:
        sandbox = await sdk.create.aio(image=sandbox_image, timeout=120)
        try:
            handle = await sandbox.exec.aio("true")
            assert await handle.wait() == 0
            await sandbox.write_bytes.aio(b"payload", "/tmp/bench-latency")
            assert await sandbox.read_bytes.aio("/tmp/bench-latency") == b"payload"
            await sdk.ls.aio()
        finally:
            await sandbox.terminate.aio(wait=True)
    calls = trace.take()

    labels = [c.label for c in calls]
    assert labels == [CREATE, "exec: true", "write_bytes", "read_bytes", "ls", "terminate"]
    assert len(injected) == len(calls), "one simulated round trip per SDK call"
    assert loop_thread not in injected, "the delay must not block the event loop"
    assert {c.sandbox for c in calls if c.label != "ls"} == {sandbox.name}
    assert all(c.seconds >= LATENCY_MS / 1000 for c in calls)  # each traced time includes its delay
    assert len(to_first_exec(calls, CREATE)) == 1
    assert _patched_surface(sdk) == before, "both patches come off after the block"


def test_no_latency_patches_nothing(docker_sandbox_sdk: ModuleType) -> None:
    before = _patched_surface(docker_sandbox_sdk)
    with injected_latency(0):
        assert _patched_surface(docker_sandbox_sdk) == before
