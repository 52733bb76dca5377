"""Helpers for the skypilot-emulator tests: a real server process per test module, the test image
pushed to the local registry, and the admin calls that turn the server's knobs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx

from osmosis_harbor.owner_process import OWNER_HOST, OWNER_PID
from osmosis_harbor.sandbox.docker.labels import IDLE_PREFIX
from osmosis_harbor.sandbox.emulator.server.process import ServerState, read_state
from tests.support.common import REPO, wait_until

LOCAL_REGISTRY = "127.0.0.1:5000"
# Pids of the emulator servers this test session started: their sandboxes are the session's
# (an emulator sandbox's owner is its server, not a host process), which the leak check counts.
SESSION_SERVERS: set[int] = set()


@dataclass
class EmulatorServer:
    """One ``python -m osmosis_harbor emulator`` process on an ephemeral loopback port."""

    process: subprocess.Popen[bytes]
    state: ServerState
    state_file: Path
    log: Path

    @property
    def url(self) -> str:
        return self.state.url

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(method, f"{self.url}/admin{path}", json=body, timeout=30)
        response.raise_for_status()
        return response.json()

    def knobs(self, **changes: Any) -> dict[str, Any]:
        knobs = {**self.admin("GET", "/stats")["knobs"], **changes}
        return self.admin("PUT", "/knobs", knobs)

    def fault(self, kind: str, path: str = "/", count: int = 1, method: str | None = None) -> None:
        self.admin("POST", "/faults", {"kind": kind, "path": path, "count": count, "method": method})

    def stats(self) -> dict[str, Any]:
        return self.admin("GET", "/stats")

    def reset(self) -> None:
        self.admin("DELETE", "/faults")
        self.knobs(
            latency_ms=0,
            cold_create_sec=0,
            pool_claim_sec=0,
            rate_503=0,
            rate_429=0,
            rate_reset=0,
            rate_hang=0,
            evict_rate=0,
            retry_after_sec=0,
            hang_sec=600,
            pool_warm_sec=0,
            pool_warm_timeout_sec=180,
        )


def start_server(directory: Path, *extra: str) -> EmulatorServer:
    directory.mkdir(parents=True, exist_ok=True)
    state_file = directory / "server.json"
    log = directory / "server.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "osmosis_harbor",
                "emulator",
                "--port",
                "0",
                "--state-file",
                str(state_file),
                "--latency-ms",
                "0",
                *extra,
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def up() -> ServerState | None:
        assert process.poll() is None, f"emulator exited: {log.read_text()}"
        state = read_state(state_file)
        if state is None or state.pid != process.pid:
            return None
        try:
            return state if httpx.get(f"{state.url}/healthz", timeout=5).status_code == 200 else None
        except httpx.HTTPError:
            return None

    SESSION_SERVERS.add(process.pid)
    state = wait_until(up, timeout=60, what="the emulator server to answer")
    return EmulatorServer(process, state, state_file, log)


def stop_server(server: EmulatorServer) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def remove_emulator_sandboxes(server: EmulatorServer) -> list[str]:
    """Remove the sandboxes ``server`` made and left (named, for the caller's assertion); other
    servers' sandboxes (another test session's on a shared engine) are theirs."""
    from osmosis_harbor.sandbox.emulator.server.state import EMULATOR_OWNER_HOST

    client = docker.from_env()
    removed = []
    for container in client.api.containers(all=True, filters={"label": "osmosis-harbor.managed=1"}):
        labels = container.get("Labels") or {}
        name = container["Names"][0].lstrip("/")
        ours = labels.get(OWNER_HOST) == EMULATOR_OWNER_HOST and labels.get(OWNER_PID) == str(server.process.pid)
        if ours and not name.startswith(IDLE_PREFIX):
            client.api.remove_container(container["Id"], force=True)
            removed.append(name)
    return removed


@contextlib.contextmanager
def emulator_env(url: str) -> Iterator[None]:
    """Point this process's skypilot-emulator SDK at ``url`` (and a fresh session)."""
    from osmosis_harbor.sandbox.emulator.client.http import session

    previous = os.environ.get("OSMOSIS_HARBOR_EMULATOR_URL")
    os.environ["OSMOSIS_HARBOR_EMULATOR_URL"] = url
    session().close()
    try:
        yield
    finally:
        session().close()
        if previous is None:
            os.environ.pop("OSMOSIS_HARBOR_EMULATOR_URL", None)
        else:
            os.environ["OSMOSIS_HARBOR_EMULATOR_URL"] = previous


def push_to_local_registry(image: str) -> str:
    """``image`` (present on the engine) as a reference in the local registry, pushed there."""
    client = docker.from_env()
    ref = f"{LOCAL_REGISTRY}/{image}"
    repository, tag = ref.rsplit(":", 1) if ":" in image else (ref, "latest")
    client.images.get(image).tag(repository, tag)
    for line in client.api.push(repository, tag=tag, stream=True, decode=True):
        assert "error" not in line, f"push of {ref} failed: {line}"
    return f"{repository}:{tag}"


def registry_tags(repository: str) -> list[str]:
    response = httpx.get(f"http://{LOCAL_REGISTRY}/v2/{repository}/tags/list", timeout=10)
    return list(response.json().get("tags") or []) if response.status_code == 200 else []


@contextlib.contextmanager
def private_emulator(
    directory: Path,
    *,
    set_env: bool = True,
    leftovers: Callable[[EmulatorServer], list[str]] = remove_emulator_sandboxes,
    extra: tuple[str, ...] = (),
) -> Iterator[EmulatorServer]:
    """A module's own emulator server (its fault knobs would disturb the session's), selected
    through the environment when ``set_env`` (``extra``: more server flags); on exit the
    sandboxes the module left are removed, the server stopped, and any leftover fails the module."""
    server = start_server(directory, *extra)
    with emulator_env(server.url) if set_env else contextlib.nullcontext():
        yield server
    left = leftovers(server)
    stop_server(server)
    assert not left, f"tests left emulator sandboxes: {left}"
