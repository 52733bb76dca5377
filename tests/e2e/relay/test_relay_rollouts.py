"""The policy relay through the real osmosis server: a workflow in a local Docker sandbox
reaches its rollout's chat endpoint on the host's loopback, and nothing else of the host.

The hostile workflow (``rollout_fixtures.probes``) tries the rollout server's own health,
status and cancel API, a canary HTTP server this test starts on 127.0.0.1 and the local
registry on 127.0.0.1:5000, on 127.0.0.1 and on the sandbox bridge's gateway. With the
relay every one fails; the positive control runs the same workflow with the explicit ``host_network=True``
opt-in, where the 127.0.0.1 targets answer.
"""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.docker.engine import sandbox_network
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

PROJECT = FIXTURES / "rollout_project"
REGISTRY = "http://127.0.0.1:5000/v2/"


@pytest.fixture
def canary() -> Iterator[tuple[str, str]]:
    """An HTTP server on 127.0.0.1 that answers every GET with a secret: (url, secret)."""
    secret = f"canary-{secrets.token_hex(8)}"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = secret.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", secret
    server.shutdown()
    server.server_close()


def make_backend(tmp_path: Path, bundles_dir: Path, agent: str, **env: Any) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=TASKS / "template",
        task_mode="template",
        agent=agent,
        workflow_config="rollout_fixtures.workflows:fixture_config" if agent.endswith("OutputWorkflow") else None,
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker", **env),
        trials_dir=tmp_path / "trials",
    )


def on_gateway(url: str, gateway: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{gateway}:{parts.port}").geturl()


async def probe_from_sandbox(
    backend: HarborBackend, fake_chat: FakeChatServer, targets: list[str], server_targets: list[str]
) -> dict[str, str]:
    """Run the probe workflow once; ``server_targets`` are paths on the rollout server itself."""
    async with serve(backend) as url, client_for(url) as client:
        rollout_id = f"probe-{uuid.uuid4().hex[:8]}"
        gateway = sandbox_network().gateway
        everything = targets + [url.rstrip("/") + path.format(rollout_id=rollout_id) for path in server_targets]
        everything += [on_gateway(t, gateway) for t in everything]
        lines = "\n".join(f"probe: {t}" for t in everything)
        result = await client.run_rollout(
            initial_messages=[{"role": "user", "content": f"{lines}\nreply: hello"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=rollout_id,
            llm_api_key="sk-probe",
            grade=False,
        )
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    report: dict[str, str] = json.loads(result.sample.messages[-1]["content"])
    assert report.pop("policy") == "hello"  # the policy endpoint itself was reached
    assert set(report) == set(everything)
    return report


# The cancel API is probed with GET: an answer (405) proves it reachable without cancelling anything.
SERVER_PATHS = ["/health", "/rollout/{rollout_id}/status", "/rollout/cancel"]


async def test_workflow_reaches_the_policy_through_the_relay(tmp_path, bundles_dir, fake_chat):
    backend = make_backend(tmp_path, bundles_dir, "rollout_fixtures.workflows:OutputWorkflow")
    before = len(fake_chat.requests)
    key = f"sk-relay-{uuid.uuid4().hex}"
    async with serve(backend) as url, client_for(url) as client:
        result = await client.run_rollout(
            initial_messages=[{"role": "user", "content": "reply: echo 42"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=f"relay-{uuid.uuid4().hex[:8]}",
            llm_api_key=key,
            grade=False,
        )
        assert backend.relay.address is not None and backend.relay.active() == 0  # the token ended with it
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.messages[-1]["content"] == "42"
    (request,) = fake_chat.requests[before:]
    # the relay forwarded the workflow's call to the original path, with the rollout's key
    assert request.path == "/v1/chat/completions" and request.authorization == f"Bearer {key}"
    assert backend.relay.address is None  # shutdown stopped it


async def test_a_workflow_reaches_no_host_service_through_the_relay(tmp_path, bundles_dir, fake_chat, canary):
    canary_url, secret = canary
    backend = make_backend(tmp_path, bundles_dir, "rollout_fixtures.probes:ProbeWorkflow")
    report = await probe_from_sandbox(backend, fake_chat, [canary_url, REGISTRY], SERVER_PATHS)
    reached = {url: outcome for url, outcome in report.items() if not outcome.startswith("failed")}
    assert reached == {}, f"the sandbox reached host services: {reached}"
    assert secret not in json.dumps(report)


async def test_positive_control_host_network_reaches_them(tmp_path, bundles_dir, fake_chat, canary):
    """The same workflow with the explicit ``host_network=True`` opt-in reaches every target
    on 127.0.0.1: the probes above would have seen the services had they been reachable."""
    canary_url, secret = canary
    backend = make_backend(tmp_path, bundles_dir, "rollout_fixtures.probes:ProbeWorkflow", host_network=True)
    report = await probe_from_sandbox(backend, fake_chat, [canary_url, REGISTRY], SERVER_PATHS)
    loopback = {url: outcome for url, outcome in report.items() if urlsplit(url).hostname == "127.0.0.1"}
    assert len(loopback) == 5 and all(outcome.startswith("reached") for outcome in loopback.values()), loopback
    assert secret in report[canary_url]
    assert report[REGISTRY].startswith("reached 200")
