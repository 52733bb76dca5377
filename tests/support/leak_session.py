"""The session's leak check (``tests/support/leaks.py``'s rule), run once per test run.

Why its own module: under pytest-xdist a run is several worker processes on one engine. A
worker that checked at its own end would see another worker's test mid-way (a CLI it has just
killed, whose sandbox that test is about to remove) as a leak of its own, and remove what that
test is looking at. So each worker only writes down what makes a sandbox the run's (its pid,
the emulator servers it started, its ledger), and the controller checks once every worker has
finished, with the same rule over all of them. Without xdist the one process checks at its end,
as before.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from tests.support.xdist_run import is_controller, run_directory

FACTS = "leak-facts"


class LeakFacts:
    """What makes a sandbox or pool this run's: the run's processes, servers and ledgers."""

    def __init__(self, own_pids: Collection[int], servers: Collection[int], ledgers: Collection[Path]) -> None:
        self.own_pids = set(own_pids)
        self.servers = set(servers)
        self.ledgers = list(ledgers)

    def write(self, directory: Path, worker: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        body = {
            "pids": sorted(self.own_pids),
            "servers": sorted(self.servers),
            "ledgers": [str(p) for p in self.ledgers],
        }
        tmp = directory / f".{worker}.json"
        tmp.write_text(json.dumps(body))
        tmp.replace(directory / f"{worker}.json")

    @classmethod
    def read_all(cls, directory: Path) -> LeakFacts:
        facts = cls((), (), ())
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            body = json.loads(path.read_text())
            facts.own_pids.update(body["pids"])
            facts.servers.update(body["servers"])
            facts.ledgers += [Path(p) for p in body["ledgers"] if Path(p).exists()]
        return facts


def remove_and_report(started: float, facts: LeakFacts) -> list[str]:
    """Remove what the run left (pools first: their members go with them); one message per kind."""
    import docker

    from osmosis_harbor.sandbox import docker as docker_sdk
    from tests.support.leaks import session_leaks, session_pools

    leaked_pools = session_pools(started, facts.servers, facts.own_pids, facts.ledgers)
    for pool in leaked_pools:
        docker_sdk.delete_pool(pool)
    leaked = session_leaks(started, facts.servers, leaked_pools, facts.own_pids)
    client = docker.from_env()
    for container_id, _ in leaked:
        client.api.remove_container(container_id, force=True, v=True)  # its /tmp volume too
    problems = []
    if leaked_pools:
        problems.append("warm pools leaked by this session (now deleted): " + ", ".join(leaked_pools))
    if leaked:
        names = [name for _, name in leaked]
        problems.append("sandbox containers leaked by this session (now removed): " + ", ".join(names))
    return problems


def facts_directory(config: pytest.Config) -> Path:
    """Shared by the controller and its workers."""
    return run_directory(config) / FACTS


class ControllerLeakCheck:
    """The check on the xdist controller, after every worker has finished."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._started = time.time() - 1

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        facts = LeakFacts.read_all(facts_directory(self._config))
        facts.own_pids.add(os.getpid())
        problems = remove_and_report(self._started, facts)
        if not problems:
            return
        reporter = self._config.pluginmanager.get_plugin("terminalreporter")
        for problem in problems:
            if reporter is not None:
                reporter.write_line(f"ERROR: {problem}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def register(config: pytest.Config) -> None:
    if is_controller(config):
        config.pluginmanager.register(ControllerLeakCheck(config), "osmosis-harbor-leak-check")
