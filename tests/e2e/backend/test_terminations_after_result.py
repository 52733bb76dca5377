"""A rollout's result does not wait for its sandboxes to go; the backend does, and its shutdown.

Real osmosis server and client, real sandboxes, on both SDK paths. The terminate of every
sandbox the rollout made is held (``OwnedSandboxes._terminate_once`` waits for the test's word),
so the claim is observable: the graded result (two sandboxes, the agent's and the separate
verifier's) arrives while both terminations are still waiting, the sandboxes still exist at that
moment, and the shutdown that follows lets them finish rather than racing them with its sweep:
each sandbox is terminated exactly once, none is left on the engine, none in the ledger.
Without the change, the result waits for the held terminations and the wait for it times out.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.sandbox.owner.context import SandboxOwner
from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes
from tests.support.backends import make_backend
from tests.support.common import graded_template, managed_containers
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = pytest.mark.slow

# Far above a graded rollout's few seconds: only a result that waits for the held terminations misses it.
RESULT_WAIT_SEC = 120


def _left(sdk: SdkPath) -> list[str]:
    if sdk.is_emulator:
        return sdk.sandboxes_left()
    return [c["Names"][0].lstrip("/") for c in managed_containers(os.getpid())]


class HeldTerminations:
    """Every terminate waits until ``release``; ``calls`` counts them by sandbox name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        self.released = asyncio.Event()
        original = OwnedSandboxes._terminate_once
        held = self

        async def held_terminate(self: OwnedSandboxes, name: str, live: Any) -> str | None:
            held.calls[name] += 1
            await held.released.wait()
            return await original(self, name, live)

        monkeypatch.setattr(OwnedSandboxes, "_terminate_once", held_terminate)


@DOCKER_PATH_ONLY
async def test_a_result_arrives_while_its_sandboxes_are_still_terminating(
    tmp_path: Path, bundles_dir: Path, fake_chat: Any, sandbox_sdk: SdkPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox_sdk.require_loopback_endpoint()
    held = HeldTerminations(monkeypatch)
    closes: list[SandboxOwner] = []
    original_close = SandboxOwner.close

    async def close(self: SandboxOwner) -> list[str]:
        closes.append(self)
        asyncio.get_running_loop().call_later(0.5, held.released.set)  # the shutdown is under way by then
        return await original_close(self)

    monkeypatch.setattr(SandboxOwner, "close", close)
    backend = make_backend(
        tmp_path,
        bundles_dir,
        agent="OutputWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path),
        sdk=sandbox_sdk,
    )
    async with serve(backend) as url, client_for(url) as client:
        result = await asyncio.wait_for(
            client.run_rollout(
                initial_messages=[{"role": "user", "content": "Write 42 to answer.txt\nreply: echo 42 > answer.txt"}],
                chat_completions_url=fake_chat.base_url,
                rollout_id=f"r-{uuid.uuid4().hex[:10]}",
                llm_api_key="sk-test-not-a-secret",
                label="42",
            ),
            RESULT_WAIT_SEC,
        )
        assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0, result.err_message
        waiting = sorted(held.calls)
        assert len(waiting) == 2 and any("verifier" in name for name in waiting), waiting  # agent's and verifier's
        assert not held.released.is_set()
        still_there = _left(sandbox_sdk)
        assert all(any(name in c for c in still_there) for name in waiting), (waiting, still_there)
    assert closes, "the backend's shutdown never closed its owner"
    assert held.calls == Counter(dict.fromkeys(waiting, 1)), held.calls  # the sweep did not terminate them again
    assert _left(sandbox_sdk) == []
    assert backend.owner.sandboxes.names() == []
    assert not [e.name for e in backend.owner.sandboxes.ledger.entries() if e.name in held.calls]


async def test_settled_waits_for_every_handed_over_termination() -> None:
    """``settle_later`` holds what it is given, tasks and coroutines alike (a caller may drop its
    references), ``settled`` waits for all of them, one that fails included, and the owner
    forgets each once it ended."""
    owner = SandboxOwner.make("test", config=settings.current(), ledger=None)
    gate = asyncio.Event()
    ended: list[str] = []

    async def ending(name: str, fail: bool = False) -> None:
        await gate.wait()
        ended.append(name)
        if fail:
            raise RuntimeError(f"{name} could not go")

    owner.settle_later(asyncio.ensure_future(ending("a")), asyncio.ensure_future(ending("b", fail=True)), ending("c"))
    waiter = asyncio.ensure_future(owner.settled())
    await asyncio.sleep(0)
    assert not waiter.done()
    gate.set()
    await asyncio.wait_for(waiter, 10)
    assert sorted(ended) == ["a", "b", "c"]
    await owner.settled()  # nothing left: returns at once
