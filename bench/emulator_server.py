"""The emulator server a bench run starts, and everything it must remove afterwards.

Why apart from the measurements: the server is a process of its own (``python -m osmosis_harbor
emulator`` on an ephemeral loopback port) with the bench's knobs, its sandboxes carry the
server as their owner (not this process, so ``bench.env.leftovers`` cannot see them), and the
run must leave nothing behind: its sandboxes, its pools, the registry tag it made on the engine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx

from osmosis_harbor.owner_process import OWNER_HOST, OWNER_PID
from osmosis_harbor.sandbox.docker.labels import IDLE_PREFIX, MANAGED_FILTER
from osmosis_harbor.sandbox.emulator.server.process import read_state
from osmosis_harbor.sandbox.emulator.server.state import EMULATOR_OWNER_HOST

from .common import Figure

__all__ = ["EMULATOR", "EmulatorRun", "start_emulator"]

EMULATOR = "skypilot-emulator"
LOCAL_REGISTRY = "127.0.0.1:5000"
START_TIMEOUT_SEC = 60.0


@dataclass
class EmulatorRun:
    """A running server, this process pointed at it, and what the run made on it."""

    process: subprocess.Popen[bytes]
    url: str
    image: str
    made_tag: bool  # the registry tag of ``image`` was created on the engine by this run
    directory: Path
    previous_url: str | None
    pools: list[str] = field(default_factory=list)
    floor: Figure | None = None

    @property
    def sdk(self) -> Any:
        from osmosis_harbor.sandbox import emulator

        return emulator

    def admin(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/admin/stats", timeout=30)
        response.raise_for_status()
        return dict(response.json())

    def calls(self) -> int:
        """API calls the server has served (the SDK's round trips; admin calls are not counted)."""
        return int(self.admin()["calls"])

    def routes(self) -> dict[str, int]:
        return dict(self.admin().get("calls_by_route") or {})

    def has_archives(self) -> bool:
        from osmosis_harbor.sandbox.emulator import EmulatorSandbox
        from osmosis_harbor.sandbox.sdk.protocol import has_archives

        return has_archives(EmulatorSandbox)

    async def pool_full(self, pool: str, size: int, timeout: float = 120.0) -> None:
        import asyncio

        from osmosis_harbor.sandbox.emulator.client import extensions

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = await extensions.get_pool.aio(pool)
            if info.idle >= size and info.starting == 0:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"pool {pool} did not fill to {size} within {timeout:g}s")

    def close(self) -> list[str]:
        """Delete the run's pools, stop the server, remove its sandboxes and the tag it made;
        returns what had to be removed or could not be (empty: nothing was left)."""
        problems: list[str] = []
        for pool in self.pools:
            try:
                self.sdk.delete_pool(pool)
            except Exception as exc:
                problems.append(f"pool {pool} not deleted: {exc}")
        self.sdk.aclose()
        _stop(self.process)
        client = docker.from_env()
        for container in client.api.containers(all=True, filters={"label": MANAGED_FILTER}):
            labels = container.get("Labels") or {}
            name = container["Names"][0].lstrip("/")
            owned = labels.get(OWNER_HOST) == EMULATOR_OWNER_HOST and labels.get(OWNER_PID) == str(self.process.pid)
            in_pool = any(name.startswith(f"{IDLE_PREFIX}{pool}") for pool in self.pools)
            if owned or in_pool:
                client.api.remove_container(container["Id"], force=True, v=True)
                problems.append(f"sandbox {name} left by the emulator run (now removed)")
        if self.made_tag:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(self.image)
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.previous_url is None:
            os.environ.pop("OSMOSIS_HARBOR_EMULATOR_URL", None)
        else:
            os.environ["OSMOSIS_HARBOR_EMULATOR_URL"] = self.previous_url
        return problems


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def push_image(image: str) -> tuple[str, bool]:
    """``image`` as a reference in the local registry (pushed); and whether the tag is new here."""
    client = docker.from_env()
    repository, tag = (f"{LOCAL_REGISTRY}/{image}".rsplit(":", 1) + ["latest"])[:2]
    ref = f"{repository}:{tag}"
    try:
        client.images.get(ref)
        made = False
    except docker.errors.ImageNotFound:
        made = True
    client.images.get(image).tag(repository, tag)
    for line in client.api.push(repository, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push of {ref} failed: {line['error']}")
    return ref, made


def start_emulator(image: str, latency_ms: float, cold_create_sec: float, pool_claim_sec: float) -> EmulatorRun:
    """A server with these knobs, this process's skypilot-emulator SDK pointed at it."""
    from osmosis_harbor.sandbox.emulator.client.http import session

    ref, made = push_image(image)
    directory = Path(tempfile.mkdtemp(prefix="osmosis-bench-emulator-"))
    state_file = directory / "server.json"
    argv = [sys.executable, "-m", "osmosis_harbor", "emulator", "--port", "0", "--state-file", str(state_file)]
    argv += ["--latency-ms", f"{latency_ms:g}", "--cold-create-sec", f"{cold_create_sec:g}"]
    argv += ["--pool-claim-sec", f"{pool_claim_sec:g}"]
    with (directory / "server.log").open("ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_SEC
    delay = 0.02
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the emulator server exited with {process.returncode}; see {directory / 'server.log'}")
        state = read_state(state_file)
        if state is not None and state.pid == process.pid:
            break
        if time.monotonic() > deadline:
            _stop(process)
            raise RuntimeError(f"the emulator server did not start within {START_TIMEOUT_SEC:g}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    previous = os.environ.get("OSMOSIS_HARBOR_EMULATOR_URL")
    os.environ["OSMOSIS_HARBOR_EMULATOR_URL"] = state.url
    session().close()
    return EmulatorRun(process, state.url, ref, made, directory, previous)
