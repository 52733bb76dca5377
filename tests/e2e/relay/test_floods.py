"""One sandbox or rollout cannot use the policy relay up for the others.

On the Docker path only: the relay, its limits and the record that blames a refusal are this
host's process, and a sandbox of either local SDK reaches it the same way (from the sandboxes'
bridge, by its source address). On the emulator's path the relay carries every rollout's calls to
a loopback policy in the key tests (``backend/test_rollouts.py``, both paths).

- A sandbox holding hundreds of half-open connections leaves another rollout chatting; with the
  relay's limits as they were (one counter for every connection, counted before its headers, no
  header timeout: the positive control) the other rollout is refused, and ends ``internal_error``
  (retried through ``infra_retries``), never blamed for it.
- Request bodies held one byte short grow the relay's process by less than 256 MB; with the byte
  bounds lifted (the control) by more.
- A rollout that floods the relay with its own calls gets its own refusals: not ``internal_error``.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import load_sandbox_sdk
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import FIXTURES, TASKS, await_until
from tests.support.emulator import push_to_local_registry
from tests.support.relay_process import RelayProcess
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

# The relay as it was: one bound for all connections, each counted before its headers, no header timeout.
TODAYS_CONNECTIONS = {
    "OSMOSIS_HARBOR_RELAY_MAX_CONNECTIONS": "256",
    "OSMOSIS_HARBOR_RELAY_RESERVED_CONNECTIONS": "0",
    "OSMOSIS_HARBOR_RELAY_MAX_SOURCE_CONNECTIONS": "256",
    "OSMOSIS_HARBOR_RELAY_HEADER_TIMEOUT_SEC": "3600",
}
HALF_OPEN = 300
BODY_BYTES = 30 * 2**20
HELD_BODIES = 20


@pytest.fixture
async def flooder(sandbox_sdk: SdkPath, sandbox_image: str) -> AsyncIterator[Callable[[str], Awaitable[None]]]:
    """``await flood(script)``: runs ``script`` in the background of a sandbox of this SDK path."""
    sdk = load_sandbox_sdk(sandbox_sdk.name)
    image = push_to_local_registry(sandbox_image) if sandbox_sdk.is_emulator else sandbox_image
    made: list[Any] = []

    async def flood(script: str) -> None:
        sandbox = await sdk.create.aio(name=f"flood-{uuid.uuid4().hex[:8]}", image=image, timeout=600)
        made.append(sandbox)
        detached = f"nohup bash -c {shlex.quote(script)} >/dev/null 2>&1 &"
        handle = await sandbox.exec.aio("bash", "-c", detached, timeout_seconds=60)
        assert await handle.wait() == 0

    yield flood
    for sandbox in made:
        await sandbox.terminate.aio(wait=True)


def half_open_flood(relay_url: str, count: int, hold_sec: float) -> str:
    """Opens ``count`` connections to the relay, each sending half a request head, holds them
    ``hold_sec``, and again, for ever (a flood the header timeout alone does not end)."""
    parts = urlsplit(relay_url)
    head = f"POST {parts.path}/chat/completions HTTP/1.1\\r\\nHost: {parts.netloc}\\r\\n"
    return (
        "trap '' PIPE; while :; do fds=(); "
        f"for i in $(seq {count}); do "
        f"if exec {{fd}}<>/dev/tcp/{parts.hostname}/{parts.port}; then printf '{head}' >&$fd; fds+=($fd); fi; "
        "done 2>/dev/null; "
        f'sleep {hold_sec}; for fd in "${{fds[@]}}"; do exec {{fd}}>&-; done; done'
    )


def held_bodies(relay_url: str, count: int, size: int) -> str:
    """``count`` calls declaring ``size`` bytes of body, each sent one byte short and held."""
    parts = urlsplit(relay_url)
    head = (
        f"POST {parts.path}/chat/completions HTTP/1.1\\r\\nHost: {parts.netloc}\\r\\nContent-Length: {size}\\r\\n\\r\\n"
    )
    one = (
        f"exec 3<>/dev/tcp/{parts.hostname}/{parts.port} && printf '{head}' >&3 && "
        f"head -c {size - 1} /dev/zero >&3; sleep 600"
    )
    return f"trap '' PIPE; for i in $(seq {count}); do bash -c {shlex.quote(one)} & done; wait"


def make_backend(tmp_path: Path, bundles_dir: Path, sdk: SdkPath, agent: str, **kwargs: Any) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=2),
        tasks_dir=TASKS / "template",
        task_mode="template",
        agent=agent,
        workflow_config="rollout_fixtures.workflows:fixture_config" if agent.endswith("OutputWorkflow") else None,
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=bundles_dir,
        environment_config=sdk.environment(),
        trials_dir=tmp_path / "trials",
        **kwargs,
    )


async def chat_rollout(url: str, fake_chat: FakeChatServer) -> tuple[Any, str]:
    rollout_id = f"relay-{uuid.uuid4().hex[:8]}"
    async with client_for(url) as client:
        result = await client.run_rollout(
            initial_messages=[{"role": "user", "content": "reply: echo 42"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=rollout_id,
            llm_api_key="sk-relay-floods",
            grade=False,
        )
    return result, rollout_id


async def held_at_least(backend: HarborBackend, connections: int) -> bool:
    return backend.relay.stats()["connections"] >= connections


async def received(relay: RelayProcess, body_bytes: int) -> bool:
    return (await asyncio.to_thread(relay.stats))["received_bytes"] == body_bytes


def diagnostics(home: Path, rollout_id: str) -> dict[str, Any]:
    """The outcome's extra_fields, as the osmosis server saved them."""
    (path,) = home.rglob(f"{rollout_id}/diagnostics.json")
    return json.loads(path.read_text())


async def flood_then_chat(
    tmp_path: Path, bundles_dir: Path, fake_chat: FakeChatServer, sdk: SdkPath, flood: Any, **kwargs: Any
) -> tuple[Any, str, int]:
    """A flood of half-open connections from one sandbox, held while another rollout chats:
    (its result, its id, the connections the flood held when it began)."""
    sdk.require_loopback_endpoint()
    backend = make_backend(tmp_path, bundles_dir, sdk, "rollout_fixtures.workflows:OutputWorkflow", **kwargs)
    async with serve(backend) as url:
        flooding = await backend.relay.register(fake_chat.base_url)  # the flooding rollout's own way in
        limits = settings.current()
        # The flood renews its connections before the relay's header timeout would end them (every
        # 4 s against the default 10 s); with no such timeout to beat (the old limits) it never lets
        # go, so the other rollout cannot call in a gap between two rounds, however late it comes.
        timeout = limits.relay_header_timeout_sec
        hold = 4 if 4 < timeout < 3600 else 3600
        await flood(half_open_flood(flooding.sandbox_url, HALF_OPEN, hold_sec=hold))
        held = min(limits.relay_max_source_connections, limits.relay_max_connections)
        await await_until(lambda: held_at_least(backend, held), timeout=120, what="the flood to be held")
        held_at_start = backend.relay.stats()["connections"]
        result, rollout_id = await chat_rollout(url, fake_chat)
    return result, rollout_id, held_at_start


@DOCKER_PATH_ONLY
async def test_a_half_open_flood_from_one_sandbox_leaves_another_rollout_chatting(
    tmp_path: Path, bundles_dir: Path, fake_chat: FakeChatServer, sandbox_sdk: SdkPath, flooder: Any, osmosis_home: Path
) -> None:
    result, rollout_id, held = await flood_then_chat(tmp_path, bundles_dir, fake_chat, sandbox_sdk, flooder)
    assert held == settings.current().relay_max_source_connections  # the flood got its sandbox's share, no more
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample.messages[-1]["content"] == "42"
    assert "relay" not in diagnostics(osmosis_home, rollout_id)  # nothing of it was refused


@DOCKER_PATH_ONLY
async def test_with_todays_relay_limits_the_flood_pays_and_the_victim_ends_internal_error(
    tmp_path: Path,
    bundles_dir: Path,
    fake_chat: FakeChatServer,
    sandbox_sdk: SdkPath,
    flooder: Any,
    osmosis_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The positive control: the flood takes every connection, so the victim's calls are refused;
    the relay's record makes that the infrastructure's failure, retried once, then reported."""
    for name, value in TODAYS_CONNECTIONS.items():
        monkeypatch.setenv(name, value)
    result, rollout_id, held = await flood_then_chat(
        tmp_path, bundles_dir, fake_chat, sandbox_sdk, flooder, infra_retries=1
    )
    assert held == 256
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR, result.err_message
    assert "the policy relay refused" in result.err_message and "the relay is full" in result.err_message
    extra = diagnostics(osmosis_home, rollout_id)
    assert extra["attempts"] == 2 and len(extra["relay_failures"]) == 1  # retried through infra_retries
    assert extra["relay"]["refused"]["infra"]["relay_full"] >= 1


@DOCKER_PATH_ONLY
async def test_a_rollout_flooding_its_own_calls_gets_its_own_refusals(
    tmp_path: Path, bundles_dir: Path, fake_chat: FakeChatServer, sandbox_sdk: SdkPath, osmosis_home: Path
) -> None:
    sandbox_sdk.require_loopback_endpoint()
    backend = make_backend(tmp_path, bundles_dir, sandbox_sdk, "rollout_fixtures.floods:SelfFloodingWorkflow")
    async with serve(backend) as url:
        result, rollout_id = await chat_rollout(url, fake_chat)
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is not RolloutErrorCategory.INTERNAL_ERROR, result.err_message
    assert "429" in result.err_message, result.err_message
    refused = diagnostics(osmosis_home, rollout_id)["relay"]["refused"]
    assert set(refused) == {"own"} and refused["own"]["token_calls"] >= 9  # 8 held calls over the bound, and its ask


# The control: a relay that holds whatever bodies come, for as long as they take (as it was).
UNBOUNDED_BODIES = {
    "OSMOSIS_HARBOR_RELAY_MAX_BUFFERED_BYTES": str(4 * 2**30),
    "OSMOSIS_HARBOR_RELAY_MAX_TOKEN_BUFFERED_BYTES": str(2 * 2**30),
    "OSMOSIS_HARBOR_RELAY_MAX_TOKEN_CALLS": "256",
    "OSMOSIS_HARBOR_RELAY_BODY_TIMEOUT_SEC": "3600",
}


@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "control-unbounded"])
@DOCKER_PATH_ONLY
async def test_bodies_held_one_byte_short_do_not_grow_the_relay(
    sandbox_sdk: SdkPath, flooder: Any, bounded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 bodies of 30 MiB from one sandbox, each held one byte short: the relay holds as many
    as its per-rollout byte bound allows (the rest are refused before being read), and its
    process grows by less than 256 MB. The control lifts the bounds: every body is held, and
    the relay grows by far more."""
    if not bounded:
        for name, value in UNBOUNDED_BODIES.items():
            monkeypatch.setenv(name, value)
    limits = settings.current()
    held = min(HELD_BODIES, limits.relay_max_token_calls, limits.relay_max_token_buffered_bytes // BODY_BYTES)
    with RelayProcess({k: v for k, v in UNBOUNDED_BODIES.items() if not bounded}) as relay:
        before = relay.rss_mib()
        await flooder(held_bodies(relay.url, HELD_BODIES, BODY_BYTES))
        await await_until(lambda: received(relay, held * (BODY_BYTES - 1)), timeout=120, what=f"{held} held bodies")
        grown = relay.rss_mib() - before
    if bounded:
        assert held == 2 and grown < 256, f"the relay grew by {grown:.0f} MiB"
    else:
        assert held == HELD_BODIES and grown > 512, f"the control held {held} bodies and grew by only {grown:.0f} MiB"
