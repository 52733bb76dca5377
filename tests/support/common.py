"""Helpers shared by the end-to-end tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import docker

if TYPE_CHECKING:
    from osmosis_harbor.sandbox import SandboxEnvironment

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tasks"
FIXTURES = REPO / "tests" / "fixtures"
MANAGED = "osmosis-harbor.managed=1"
OWNER_PID = "osmosis-harbor.owner-pid"


def managed_containers(owner_pid: int | None = None) -> list[dict]:
    """Containers of the Docker sandbox emulation, optionally only one process's.

    One list call (no per-container inspect), so containers removed while we look do
    not make the listing itself fail.
    """
    labels = [MANAGED] + ([f"{OWNER_PID}={owner_pid}"] if owner_pid is not None else [])
    return docker.from_env().api.containers(all=True, filters={"label": labels})


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphaned_containers(before: set[str], owner_pid: int) -> list[dict]:
    """Sandbox containers made since ``before`` by ``owner_pid`` (a CLI run: ``run_cli``'s pid),
    that process having exited: what it leaked. Another process's (another xdist worker's CLI,
    killed by its test a moment before that test removes its sandboxes) are not this run's."""
    assert not process_alive(owner_pid), f"process {owner_pid} is still running: it may yet remove its sandboxes"
    return [c for c in managed_containers(owner_pid) if c["Id"] not in before]


class CliRun(subprocess.CompletedProcess[str]):
    """A finished CLI run, with the pid its sandboxes carry as their owner."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str, pid: int) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.pid = pid


def run_cli(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> CliRun:
    """``python -m osmosis_harbor ARGS``, its tables 200 columns wide unless ``env`` says: Rich
    takes the width of a terminal on any standard stream, and there is none under an xdist worker
    (its stdin is /dev/null), where the 80-column default would cut the cells tests read."""
    argv = [sys.executable, "-m", "osmosis_harbor", *args]
    with subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return CliRun(argv, proc.returncode, stdout, stderr, proc.pid)


def wait_until(predicate: Callable[[], object], *, timeout: float, what: str = "condition"):
    """Poll ``predicate`` (backing off from 20 ms to 0.5 s) until truthy, which is returned,
    or fail after ``timeout`` seconds. Polling a condition, never sleeping a fixed time."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


async def await_until(predicate: Callable[[], Awaitable[object]], *, timeout: float, what: str = "condition"):
    """``wait_until`` for async predicates, polling on the event loop with the same backoff."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


def make_task(
    root: Path,
    task_id: str,
    *,
    dockerfile: str | None = None,
    solve: str = "echo ok > /tmp/done",
    test: str | None = None,
    toml_extra: str = "",
) -> Path:
    """Write a small valid Harbor task (reward 1 when /tmp/done exists) under ``root``. Its
    allowance names ``/tmp/done``, so a fresh verifier's sandbox gets the agent's (``/tmp`` itself
    is not carried: docs/threat-model.md, "Verification modes")."""
    task = root / task_id
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Create /tmp/done.\n")
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n'
        f"[environment]\nbuild_timeout_sec = 300\n{toml_extra}"
        '\n[metadata.osmosis_harbor.verifier_allowance]\npaths = ["/tmp/done"]\n'
    )
    marker = uuid.uuid4().hex
    (task / "environment" / "Dockerfile").write_text(
        dockerfile or f"FROM debian:trixie-slim\nRUN echo {marker} > /marker\n"
    )
    script = task / "solution" / "solve.sh"
    script.write_text(f"#!/bin/bash\n{solve}\n")
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        + (
            test
            or "if [ -f /tmp/done ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
        )
    )
    script.chmod(0o755)
    test_sh.chmod(0o755)
    return task


def made_environment(task_dir: Path, trial_dir: Path, session_prefix: str) -> SandboxEnvironment:
    """A Docker sandbox environment for the task at ``task_dir``, made the way Harbor makes a
    trial's (its factory, a trial's paths under ``trial_dir``), not started."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from osmosis_harbor.sandbox import SandboxEnvironment, environment_config

    task = Task(task_dir)
    trial_paths = TrialPaths(trial_dir)
    trial_paths.mkdir()
    environment = EnvironmentFactory.create_environment_from_config(
        environment_config("docker"),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"{session_prefix}-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
    )
    assert isinstance(environment, SandboxEnvironment)
    return environment


@contextlib.asynccontextmanager
async def started_environment(
    root: Path, task_id: str, *, session_prefix: str | None = None
) -> AsyncIterator[SandboxEnvironment]:
    """A started Docker sandbox environment for a small task with ``WORKDIR /work``
    (``made_environment``; its session id from ``session_prefix``, else the task id), stopped
    and deleted afterwards."""
    task_dir = make_task(root / "ds", task_id, dockerfile="FROM debian:trixie-slim\nWORKDIR /work\n")
    environment = made_environment(task_dir, root / "trial", session_prefix or task_id)
    await environment.start(force_build=False)
    try:
        yield environment
    finally:
        await environment.stop(delete=True)


def graded_template(root: Path, name: str = "template-graded") -> Path:
    """The bundled template task without ``tests/``, copied under ``root``: the Osmosis grader
    (generated ``test.sh``) is its verifier, in a sandbox of its own."""
    task = shutil.copytree(TASKS / "template", root / name)
    shutil.rmtree(task / "tests")
    return task


def copy_task(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())
