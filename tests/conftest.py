"""Shared pytest fixtures only (helpers live in tests/support.py). Keep this file small."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .emulator_support import EmulatorServer
from .sdk_paths import SdkPath
from .xdist_run import is_worker, run_directory

SANDBOX_IMAGE = os.environ.get("OSMOSIS_HARBOR_TEST_IMAGE", "debian:trixie-slim")


@pytest.fixture(scope="session", autouse=True)
def _session_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The run's own sandbox ledger (inherited by the processes it starts), never the user's:
    a backend's start reaps dead owners' leftovers, and another run's are not this run's. Under
    xdist each worker has its own (its base temp is its own): one worker's reaping never reaches
    a sandbox another worker's test is still handling."""
    path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OSMOSIS_HARBOR_LEDGER", str(path))
        yield path


@pytest.fixture(scope="session", autouse=True)
def _session_allowances(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where this run's validate commands record verifier allowances: never the user's cache."""
    path = tmp_path_factory.mktemp("verifier-allowances")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OSMOSIS_HARBOR_VERIFIER_ALLOWANCES", str(path))
        yield path


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """A locally present image (no registry is reachable, nothing is ever pulled)."""
    return SANDBOX_IMAGE


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


@pytest.fixture(scope="session")
def bundles_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's bundle cache, shared by every backend a test makes: a bundle is built once
    per run, not once per module or test. Sharing it changes no claim: the cache is
    content-addressed (project files, targets and shim), and nothing the session runs edits a
    bundled project. Tests of the cache itself give their own directory. Under xdist the workers
    of a run share it too (beside their own base temps): the cache is made for concurrent builders
    (each builds in a scratch directory and renames it into place; a loser keeps the winner's)."""
    if is_worker(request.config):
        shared = run_directory(request.config) / "bundles"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("bundles")


@pytest.fixture(scope="session", autouse=True)
def _session_bundle_cache(bundles_dir: Path) -> Iterator[None]:
    """The default bundle cache (``$OSMOSIS_HARBOR_BUNDLES``) of this process and the commands
    it runs is the session's, never ``./bundles`` in the checkout."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OSMOSIS_HARBOR_BUNDLES", str(bundles_dir))
        yield


@pytest.fixture
def osmosis_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The osmosis server saves trajectories under ~/.osmosis: keep them in the test's tmp dir.
    Modules that serve rollouts use it for every test (``pytest.mark.usefixtures``)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def pytest_addoption(parser: pytest.Parser) -> None:
    from . import timeouts

    timeouts.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist: the ``exclusive`` marker's lock, and the leak check on the controller;
    everywhere: a test that outlives its timeout fails, with every stack (``tests/timeouts.py``)."""
    from . import exclusive, leak_session, schedule, timeouts

    exclusive.register(config)
    leak_session.register(config)
    schedule.register(config)
    timeouts.register(config)


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_sandboxes(request: pytest.FixtureRequest, _session_ledger: Path) -> Iterator[None]:
    """Fail the session if it leaves sandbox containers or warm pools behind, after removing them.

    Counted (``tests/leaks.py``): containers and pools made during the session by this process,
    by a process that has exited since (the CLI subprocesses the tests run), or by an emulator
    server this session started. Idle members of a pool that still exists are its own, unless the
    session made that pool and did not delete it: then the pool is the leak (and its members go
    with it). Removing first means one leaky run does not poison the next one. On an xdist
    worker this only writes down what is the run's: the controller checks once every worker has
    finished (``tests/leak_session.py``).
    """
    import time

    from .emulator_support import SESSION_SERVERS
    from .leak_session import LeakFacts, facts_directory, remove_and_report

    started = time.time() - 1
    yield
    config = request.config
    if is_worker(config):
        facts = LeakFacts({os.getpid()}, SESSION_SERVERS, [_session_ledger])
        facts.write(facts_directory(config), config.workerinput["workerid"])  # type: ignore[attr-defined]
        return
    problems = remove_and_report(started, LeakFacts((), SESSION_SERVERS, [_session_ledger]))
    assert not problems, "; ".join(problems)


@pytest.fixture(scope="session")
def emulator_server(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> Iterator[EmulatorServer]:
    """One skypilot-emulator server for the session (ephemeral loopback port, no latency), this
    process pointed at it (``OSMOSIS_HARBOR_EMULATOR_URL``), the test image in the local registry.
    Stopped at the end; what its sandboxes left is the leak check's to report and remove."""
    from .emulator_support import emulator_env, push_to_local_registry, start_server, stop_server

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
