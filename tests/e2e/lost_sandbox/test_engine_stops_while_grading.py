"""The engine stopping while the task's tests run is the infrastructure's failure
(``internal_error``), not the workflow's, through the real osmosis server.

The host process runs in a subprocess whose ``DOCKER_HOST`` is a Unix-socket relay to the real
engine that this test owns: once the tests wait at a gate (a FIFO in /tmp, which is also how
the test knows grading is under way), the relay goes away, as a stopped engine does for its
clients: open connections drop, new ones are refused. The real engine (and every other user
of it) is untouched; the test removes the rollout's containers afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import docker
import pytest

from tests.support.common import FIXTURES, REPO, TASKS, managed_containers, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

GATE = "/tmp/grading-gate"
HOST = """
import asyncio, json, sys
from pathlib import Path
from harbor.trial.queue import TrialQueue
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.serving.local import run_one_rollout
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.testing.scripted_policy import FakeChatServer

project, task, bundles, trials = map(Path, sys.argv[1:5])
backend = HarborBackend(orchestrator=TrialQueue(n_concurrent=1), tasks_dir=task,
                        agent="rollout_fixtures.workflows:OutputWorkflow",
                        workflow_config="rollout_fixtures.workflows:fixture_config",
                        code_dir=project, bundles_dir=bundles, trials_dir=trials,
                        environment_config=environment_config("docker"))
policy = FakeChatServer()
result = asyncio.run(run_one_rollout(backend=backend, prompt="reply: echo 42 > answer.txt",
                                     chat_completions_url=policy.base_url, api_key="sk-engine-lost-test",
                                     label="42", metadata=None, grade=True))
print("RESULT " + result.model_dump_json(), flush=True)
"""


class EngineRelay:
    """A Unix socket that relays every connection to the engine, until ``cut``."""

    def __init__(self, path: Path, upstream: str = "/var/run/docker.sock") -> None:
        self.path, self.upstream = path, upstream
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # cut
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.upstream)
            with self.lock:
                self.sockets += [client, engine]
            for a, b in ((client, engine), (engine, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def cut(self) -> None:
        """The engine stops: the socket goes, and every open connection with it."""
        self.listener.close()
        self.path.unlink(missing_ok=True)
        with self.lock:
            for sock in self.sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


@pytest.fixture
def blocking_task(tmp_path: Path) -> Path:
    task = shutil.copytree(TASKS / "template", tmp_path / "tasks" / "blocking-tests")
    (task / "tests" / "test.sh").write_text(
        f"#!/bin/bash\nmkdir -p /logs/verifier\nmkfifo {GATE} && read x < {GATE}\necho 1 > /logs/verifier/reward.txt\n"
    )
    return task


def grading_container(owner: int) -> dict | None:
    """The host's running sandbox whose tests wait at the gate."""
    api = docker.from_env().api
    for container in managed_containers(owner_pid=owner):
        if container["State"] != "running":
            continue
        try:
            exec_id = api.exec_create(container["Id"], ["test", "-p", GATE])["Id"]
            api.exec_start(exec_id)
            if api.exec_inspect(exec_id)["ExitCode"] == 0:
                return container
        except docker.errors.APIError:
            continue
    return None


async def test_the_engine_stopping_during_grading_is_an_internal_error(tmp_path, bundles_dir, blocking_task):
    relay = EngineRelay(tmp_path / "engine.sock")
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(FIXTURES / "rollout_project"), str(blocking_task), str(bundles_dir)]
        + [str(tmp_path / "trials")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DOCKER_HOST": f"unix://{relay.path}", "HOME": str(tmp_path / "home")},
    )
    try:
        await asyncio.to_thread(
            wait_until, lambda: grading_container(host.pid) or host.poll() is not None, timeout=300, what="grading"
        )
        assert host.poll() is None, "the host ended before grading waited at the gate"  # the attack is set up
        relay.cut()
        out, err = await asyncio.to_thread(host.communicate, timeout=300)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        for container in managed_containers(owner_pid=host.pid):  # the engine outlived its client
            docker.from_env().api.remove_container(container["Id"], force=True)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, err[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["status"] == "failure", result
    assert result["err_category"] == "internal_error", result["err_message"]
    assert "verif" in result["err_message"], result["err_message"]
