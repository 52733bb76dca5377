"""Session-wide fixtures of every layer (helpers live in tests/support/; the end-to-end fixtures in
tests/e2e/conftest.py). Keep this file small."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.xdist_run import is_worker, run_directory

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


def pytest_addoption(parser: pytest.Parser) -> None:
    from tests.support import timeouts

    timeouts.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist: the ``exclusive`` marker's lock, and the leak check on the controller;
    everywhere: a test that outlives its timeout fails, with every stack (``tests/support/timeouts.py``),
    and SIGINT has its default action in what the tests start.

    A run started in the background by a non-interactive shell (``cmd &``, as a CI script may)
    begins with SIGINT ignored, and an ignored signal stays ignored across ``exec``: every
    process a test starts and then interrupts like a user's Ctrl-C would shrug it off. Python's
    own handler instead is reset to the default action in each child."""
    import signal

    from tests.support import exclusive, leak_session, timeouts

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    exclusive.register(config)
    leak_session.register(config)
    timeouts.register(config)


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_sandboxes(request: pytest.FixtureRequest, _session_ledger: Path) -> Iterator[None]:
    """Fail the session if it leaves sandbox containers or warm pools behind, after removing them.

    Counted (``tests/support/leaks.py``): containers and pools made during the session by this process,
    by a process that has exited since (the CLI subprocesses the tests run), or by an emulator
    server this session started. Idle members of a pool that still exists are its own, unless the
    session made that pool and did not delete it: then the pool is the leak (and its members go
    with it). Removing first means one leaky run does not poison the next one. On an xdist
    worker this only writes down what is the run's: the controller checks once every worker has
    finished (``tests/support/leak_session.py``).
    """
    import time

    from tests.support.emulator import SESSION_SERVERS
    from tests.support.leak_session import LeakFacts, facts_directory, remove_and_report

    started = time.time() - 1
    yield
    config = request.config
    if is_worker(config):
        facts = LeakFacts({os.getpid()}, SESSION_SERVERS, [_session_ledger])
        facts.write(facts_directory(config), config.workerinput["workerid"])  # type: ignore[attr-defined]
        return
    problems = remove_and_report(started, LeakFacts((), SESSION_SERVERS, [_session_ledger]))
    assert not problems, "; ".join(problems)
