"""The skypilot-emulator's fault knobs, each seen from the client as an HTTP session sees it,
and its durability: sandboxes outlive the client process and the server process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import emulator as sky
from osmosis_harbor.sandbox.emulator.server.process import read_state
from osmosis_harbor.sandbox.sdk.liveness import sandbox_state
from tests.support.common import REPO, wait_until
from tests.support.emulator import (
    EmulatorServer,
    emulator_env,
    start_server,
    stop_server,
)


def _name(stem: str) -> str:
    return f"emu-{stem}-{uuid.uuid4().hex[:6]}"


def test_503_is_retried_within_the_budget_then_surfaces(emulator: EmulatorServer) -> None:
    emulator.fault("503", path="/sandboxes", method="GET", count=2)
    assert isinstance(sky.ls(), list)  # two 503s, then an answer: inside the SDK's budget of 3
    assert emulator.stats()["faults"] == {"503": 2}
    emulator.fault("503", path="/sandboxes", method="GET", count=4)
    with pytest.raises(sky.ApiUnavailableError):
        sky.ls()
    assert emulator.stats()["faults"] == {"503": 6}


def test_429_honours_retry_after_then_surfaces(emulator: EmulatorServer, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator.knobs(retry_after_sec=0.2)
    emulator.fault("429", path="/sandboxes", count=1)
    sky.ls()
    monkeypatch.setenv("OSMOSIS_HARBOR_EMULATOR_RETRIES", "0")
    emulator.fault("429", path="/sandboxes", count=1)
    with pytest.raises(sky.RateLimitError) as caught:
        sky.ls()
    assert caught.value.retry_after == 0.2
    assert emulator.stats()["faults"] == {"429": 2}


def test_connection_reset_surfaces_as_a_connection_error(emulator: EmulatorServer) -> None:
    emulator.fault("reset", path="/sandboxes", count=1)
    with pytest.raises(sky.ApiConnectionError) as caught:
        sky.ls()
    # SkyPilot's documented name, a RuntimeError: not the builtin ConnectionError our code may not rely on
    assert isinstance(caught.value, sky.ApiServerConnectionError) and not isinstance(caught.value, ConnectionError)
    assert "Connection reset by peer" in str(caught.value)  # a TCP RST, not a clean close
    assert isinstance(sky.ls(), list)  # the next call gets through on a new connection


def test_a_call_that_hangs_times_out_on_the_client(emulator: EmulatorServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_EMULATOR_TIMEOUT", "1")
    emulator.knobs(hang_sec=5)
    emulator.fault("hang", path="/sandboxes", count=1)
    with pytest.raises(sky.ApiTimeoutError):
        sky.ls()
    assert emulator.stats()["faults"] == {"hang": 1}


async def test_an_evicted_sandbox_is_gone_for_its_client(emulator: EmulatorServer, image: str) -> None:
    sb = sky.create(name=_name("evict"), image=image, timeout=600)
    other = sky.create(name=_name("bystander"), image=image, timeout=600)
    try:
        emulator.fault("evict", path=f"{sb.path}/exec", count=1)  # evicted under the next exec
        with pytest.raises(sky.SandboxNotFoundError):
            sb.exec("true")
        assert emulator.stats()["evicted"] == [sb.name]
        assert (await sandbox_state(sky, sb.name)).status is None  # what liveness sees: lost
        assert (await sandbox_state(sky, other.name)).live
        assert emulator.admin("POST", f"/evict/{other.name}") == {"evicted": other.name}
        with pytest.raises(sky.SandboxNotFoundError):
            other.read_bytes("/etc/hostname")
    finally:
        sb.terminate()
        other.terminate()


def test_seeded_fault_rates_repeat(emulator: EmulatorServer) -> None:
    def pattern() -> list[str]:
        emulator.admin("DELETE", "/faults")
        emulator.knobs(seed=7, rate_503=0.3, retry_after_sec=0)
        outcomes = []
        for _ in range(12):
            try:
                sky.ls()
                outcomes.append("ok")
            except sky.ApiUnavailableError:
                outcomes.append("503")
        return outcomes

    os.environ["OSMOSIS_HARBOR_EMULATOR_RETRIES"] = "0"
    try:
        first, second = pattern(), pattern()
    finally:
        del os.environ["OSMOSIS_HARBOR_EMULATOR_RETRIES"]
    assert first == second and "503" in first and "ok" in first


def test_latency_knob_delays_every_call(emulator: EmulatorServer) -> None:
    import time

    emulator.knobs(latency_ms=300)
    started = time.monotonic()
    sky.ls()
    assert time.monotonic() - started >= 0.3  # a lower bound: the server waits at least that


def test_restart_keeps_sandboxes(emulator: EmulatorServer, image: str) -> None:
    sb = sky.create(name=_name("restart"), image=image, env={"KEPT": "yes"}, timeout=600)
    try:
        pid = emulator.admin("POST", "/restart")["pid"]

        def back() -> bool:
            try:
                return emulator.stats()["calls"] == 0  # a fresh process: nothing counted yet
            except Exception:
                return False

        wait_until(back, timeout=60, what="the restarted emulator")
        assert emulator.stats()["pid"] == pid  # re-executed in place
        assert sb.name in {r.name for r in sky.ls()}
        handle = sb.exec("sh", "-c", 'printf %s "$KEPT"')
        assert handle.wait() == 0 and handle.stdout.read() == "yes"
    finally:
        sb.terminate()


def test_sandboxes_outlive_a_killed_client(emulator: EmulatorServer, image: str) -> None:
    name = _name("orphan")
    script = textwrap.dedent(
        f"""
        import sys, threading
        from osmosis_harbor.sandbox import emulator as sky
        sky.create(name={name!r}, image={image!r}, timeout=600)
        print("created", flush=True)
        threading.Event().wait()
        """
    )
    env = {**os.environ, "OSMOSIS_HARBOR_EMULATOR_URL": emulator.url}
    client = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and client.stdout.readline() == "created\n"
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    listed = {r.name: r for r in sky.ls()}
    assert name in listed
    listed[name].terminate()  # the client's handle died with it: ls() gives a terminable record


def test_a_new_server_recovers_a_dead_servers_sandboxes(tmp_path: Path, image: str) -> None:
    """A server started on the same state file (what the on-demand launcher does when the
    recorded server stops answering) is the same account: it lists and reaches what its
    predecessor made; a server on another state file is another account and does not. The first
    server is frozen (SIGSTOP: it answers nothing, as if dead) rather than killed while the second
    runs: its pid stays alive, so no other process on this shared machine takes its sandboxes for
    a dead owner's leftovers in the meantime. It is killed at the end."""
    first = start_server(tmp_path / "account")
    name = _name("survivor")
    try:
        with emulator_env(first.url):
            sky.create(name=name, image=image, env={"FROM": "first"}, timeout=600)
        first.process.send_signal(signal.SIGSTOP)
        stranger = start_server(tmp_path / "another-account")
        try:
            with emulator_env(stranger.url):
                assert name not in {r.name for r in sky.ls()}  # control: not another account's
        finally:
            stop_server(stranger)
        second = start_server(tmp_path / "account")
        assert second.state.predecessors == [first.process.pid]
        try:
            with emulator_env(second.url):
                listed = {r.name: r for r in sky.ls()}
                assert name in listed
                sb = listed[name]  # ls() records are handles
                handle = sb.exec("sh", "-c", 'printf %s "$FROM"')
                assert handle.wait() == 0 and handle.stdout.read() == "first"
                sb.terminate()
                assert name not in {r.name for r in sky.ls()}
        finally:
            stop_server(second)
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()


def test_on_demand_start_is_one_server_for_concurrent_clients(tmp_path: Path) -> None:
    script = (
        "from osmosis_harbor import settings; from osmosis_harbor.sandbox.emulator.server import launcher; "
        "print(launcher.server_url(settings.current()), flush=True)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OSMOSIS_HARBOR_EMULATOR_URL"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    clients = [
        subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    urls = {c.communicate(timeout=120)[0].strip() for c in clients}
    state = tmp_path / "cache" / "osmosis-harbor" / "emulator" / "server.json"
    recorded = read_state(state)
    assert recorded is not None
    try:
        assert urls == {recorded.url}  # three clients, one server
        assert recorded.url.startswith("http://127.0.0.1:")
        with emulator_env(recorded.url):
            assert sky.ls() is not None
    finally:
        os.kill(recorded.pid, signal.SIGTERM)
