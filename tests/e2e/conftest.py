"""Fixtures of the end-to-end layer (real sandboxes on both SDK paths, the osmosis server's
scripted policy); the session-wide ones (ledger, bundle cache, leak check) are in tests/conftest.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.emulator import EmulatorServer
from tests.support.sdk_paths import SdkPath


@pytest.fixture(scope="session")
def docker_sandbox_sdk() -> ModuleType:
    """The Docker implementation of ``sky.sandbox``; skips when no engine is reachable."""
    from osmosis_harbor.sandbox import docker as docker_sdk

    try:
        docker_sdk.ls()
    except docker_sdk.DockerEngineUnavailable as exc:  # a missing engine is a failure, not a skip
        pytest.fail(f"{exc} (scripts/bootstrap.sh starts one)")
    return docker_sdk


@pytest.fixture(scope="module")
def fake_chat() -> Iterator[FakeChatServer]:
    """A scripted policy endpoint on 127.0.0.1, one per test module."""
    server = FakeChatServer()
    yield server
    server.close()


@pytest.fixture
def osmosis_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The osmosis server saves trajectories under ~/.osmosis: keep them in the test's tmp dir.
    Modules that serve rollouts use it for every test (``pytest.mark.usefixtures``)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture(scope="session")
def emulator_server(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> Iterator[EmulatorServer]:
    """One skypilot-emulator server for the session (ephemeral loopback port, no latency), this
    process pointed at it (``OSMOSIS_HARBOR_EMULATOR_URL``), the test image in the local registry.
    Stopped at the end; what its sandboxes left is the leak check's to report and remove."""
    from tests.support.emulator import emulator_env, push_to_local_registry, start_server, stop_server

    push_to_local_registry(sandbox_image)
    server = start_server(tmp_path_factory.mktemp("emulator-session"))
    try:
        with emulator_env(server.url):
            yield server
    finally:
        stop_server(server)


@pytest.fixture(params=["docker", "skypilot-emulator"])
def sandbox_sdk(request: pytest.FixtureRequest) -> SdkPath:
    """Each key test on both paths: the Docker SDK and SkyPilot's SDK served by the emulator."""
    if request.param == "docker":
        return SdkPath("docker")
    return SdkPath(request.param, request.getfixturevalue("emulator_server"))


@pytest.fixture
def sdk_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every sandbox SDK call the Docker implementation serves, counted by kind: what each
    would cost as a round trip to the SkyPilot API server."""
    from osmosis_harbor.sandbox import docker as docker_sdk
    from osmosis_harbor.sandbox.docker import exec as exec_module
    from osmosis_harbor.sandbox.sdk.calls import Dual

    counter: Counter[str] = Counter()

    def counting(name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counter[name] += 1
            return fn(*args, **kwargs)

        return counted

    create = docker_sdk.create
    monkeypatch.setattr(docker_sdk, "create", Dual(counting("create", create._fn), on_abandon=create._on_abandon))
    cls = docker_sdk.DockerSandbox
    for name in ("put_archive", "get_archive", "write_bytes", "read_bytes", "terminate"):
        monkeypatch.setattr(cls, name, Dual(counting(name, cls.__dict__[name]._fn)))
    # the streaming form of get_archive: the same round trip
    monkeypatch.setattr(cls, "stream_archive", Dual(counting("get_archive", cls.__dict__["stream_archive"]._fn)))
    launch = exec_module.ExecMethod.aio

    async def counted_exec(self: Any, *argv: str, **kwargs: Any) -> Any:
        counter["exec"] += 1
        return await launch(self, *argv, **kwargs)

    monkeypatch.setattr(exec_module.ExecMethod, "aio", counted_exec)
    return counter
