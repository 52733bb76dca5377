"""The two sandbox paths a key test runs on: ``docker`` and ``skypilot-emulator``.

Why: our users run trials on SkyPilot Sandboxes, whose SDK has no archive capability, no host
networking and images only by registry reference; the Docker implementation has all three.
A test parametrized over :class:`SdkPath` (the ``sandbox_sdk`` fixture) proves its claim on
both, with the same body. On the emulator, the session's server is the one this session
started (``emulator_support.start_server``), reached through ``OSMOSIS_HARBOR_EMULATOR_URL``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import docker
import pytest
from harbor.models.trial.config import EnvironmentConfig

from osmosis_harbor.owner_process import OWNER_HOST, OWNER_PID
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.docker.labels import IDLE_PREFIX
from osmosis_harbor.sandbox.emulator.server.state import EMULATOR_OWNER_HOST
from osmosis_harbor.sandbox.sdk.registry import implementation
from tests.support.emulator import EmulatorServer

EMULATOR = "skypilot-emulator"
NO_LOOPBACK = (
    "a SkyPilot sandbox cannot reach this machine's loopback (the chat endpoint must be a public URL), "
    "and this SDK's registration has no policy relay for it (relays_host_endpoint)"
)


@dataclass(frozen=True)
class SdkPath:
    """One sandbox SDK under test; ``emulator`` is the session's server on the emulator path."""

    name: str
    emulator: EmulatorServer | None = None

    @property
    def is_emulator(self) -> bool:
        return self.emulator is not None

    @property
    def owner_pid(self) -> int:
        """The owner label of this path's sandbox containers: this process, or the emulator server."""
        return self.emulator.process.pid if self.emulator is not None else os.getpid()

    def environment(self, **kwargs: Any) -> EnvironmentConfig:
        """The environment config of this path (a loopback chat endpoint reaches either through
        the backend's policy relay)."""
        return environment_config(self.name, **kwargs)

    def cli_env(self) -> dict[str, str]:
        """Environment for a CLI subprocess on this path."""
        return {"OSMOSIS_HARBOR_EMULATOR_URL": self.emulator.url} if self.emulator is not None else {}

    def stats(self) -> dict[str, Any]:
        assert self.emulator is not None
        return self.emulator.stats()

    def routes(self) -> dict[str, int]:
        """The emulator's calls so far, by route (empty on the Docker path)."""
        return self.stats()["calls_by_route"] if self.is_emulator else {}

    def sandboxes_left(self) -> list[str]:
        """On the emulator, the sandboxes the session's server made that still exist (each test
        leaves none). Read from the engine by owner, not through the API: ``ls`` would be faulted
        by the knobs a test set, and the engine is what the server cannot hide."""
        if self.emulator is None:
            return []
        containers = docker.from_env().api.containers(
            all=True, filters={"label": [f"{OWNER_HOST}={EMULATOR_OWNER_HOST}", f"{OWNER_PID}={self.owner_pid}"]}
        )
        return [n for c in containers if not (n := c["Names"][0].lstrip("/")).startswith(IDLE_PREFIX)]

    def require_loopback_endpoint(self) -> None:
        """Skip, naming SkyPilot's limit, where a rollout's loopback chat endpoint cannot be reached."""
        if self.is_emulator and not getattr(implementation(self.name), "relays_host_endpoint", False):
            pytest.skip(NO_LOOPBACK)

    def assert_harbors_transfer_path(self, before: dict[str, int]) -> None:
        """On the emulator, SkyPilot's own calls carried every directory (the SDK offers no
        archives): file writes for uploads, and execs, whose output or a file read brings a fetched
        tree back (a small one rides its command's output: ``exec_folds.py``)."""
        if self.emulator is None:
            return
        from osmosis_harbor.sandbox.emulator import EmulatorSandbox
        from osmosis_harbor.sandbox.sdk.protocol import has_archives

        after = self.stats()["calls_by_route"]
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert not has_archives(EmulatorSandbox), "the emulator's sandboxes must not offer archives"
        assert not [k for k in after if "archive" in k], after
        assert delta.get("PUT /sandboxes/{name}/files", 0) > 0, f"no file was written through the emulator: {delta}"
        assert delta.get("POST /sandboxes/{name}/exec", 0) > 0, delta


DOCKER = SdkPath("docker")  # the default path of a helper that is not parametrized

# A test off the key paths runs on one SDK path (tests/README.md, "Both SDK paths or one"): the
# Docker one, which needs no emulator server. It overrides the ``sandbox_sdk`` fixture's params.
DOCKER_PATH_ONLY = pytest.mark.parametrize("sandbox_sdk", ["docker"], indirect=True)
