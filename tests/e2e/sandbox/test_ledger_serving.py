"""kill -9 of a real serving process mid-rollout (``tests.support.shutdown_server``: a HarborBackend that
prewarmed a warm pool and serves through the osmosis server, on Docker): the ledger names its
sandbox and its pool, and ``cleanup`` leaves 0 of either, in the ledger and in ``ls``. The
rollout is mid-run by construction: its workflow waits on a policy call the test never answers."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox.ledger.store import Kind, default_ledger
from tests.e2e.backend.test_shutdown import GatedPolicy, server_process
from tests.support.common import wait_until
from tests.support.ledger import cleanup

pytestmark = pytest.mark.slow


@pytest.fixture
def policy() -> Iterator[GatedPolicy]:
    server = GatedPolicy(default_reply="echo osmosis > answer.txt")
    yield server
    server.close()


# exclusive: the dead server's sandbox is also what any other process's background reap removes
# (engine-wide, by design); between the kill and the cleanup under test, no other test may run
@pytest.mark.exclusive
def test_kill_9_of_a_serving_process_mid_rollout_leaves_nothing_after_cleanup(
    tmp_path: Path, policy: GatedPolicy, monkeypatch: pytest.MonkeyPatch, bundles_dir: Path
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_LEDGER", str(tmp_path / "ledger.sqlite3"))
    ledger = default_ledger(settings.current())
    pool_base = f"kill{uuid.uuid4().hex[:6]}"
    with server_process(tmp_path, pool_base, bundles_dir) as (proc, url):
        body = {
            "initial_messages": [{"role": "user", "content": "Write the answer.\ngate: never"}],
            "chat_completions_url": policy.base_url,
            "rollout_id": "killed-mid-rollout",
            "llm_api_key": "sk-ledger-kill-key",
        }
        assert httpx.post(f"{url}/rollout", json=body, timeout=30).status_code == 202
        wait_until(lambda: "never" in policy.gated(), timeout=300, what="the workflow to call its policy")
        owned = {(e.kind, e.name) for e in ledger.entries() if e.owner.pid == proc.pid}
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    sandboxes = {name for kind, name in owned if kind is Kind.SANDBOX}
    pools = {name for kind, name in owned if kind is Kind.POOL}
    # Positive control: the dead server's rollout sandbox and its pool exist and are recorded.
    assert sandboxes and pools
    assert sandboxes <= {r.name for r in docker_sdk.ls()} and pools <= {p.name for p in docker_sdk.list_pools()}
    done = cleanup("docker", "--json", str(tmp_path / "report.json"))
    assert done.returncode == 0, done.stderr
    reported = {r["name"] for r in json.loads((tmp_path / "report.json").read_text())["ledger"]}
    assert reported == sandboxes | pools
    assert not sandboxes & {r.name for r in docker_sdk.ls()}
    assert not pools & {p.name for p in docker_sdk.list_pools()}
    assert [e for e in ledger.entries() if e.owner.pid == proc.pid] == []
