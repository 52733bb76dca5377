"""A wrong answer stays a wrong answer whatever chat call the workflow makes after it: through the
real osmosis server, Harbor's TrialQueue and the policy relay.

On the Docker path only: what answers the second call (the relay's refusal, its timeout, the
endpoint gone) and how the host reads the relay's record into a category are this host's, the
same for a sandbox of either local SDK on the sandboxes' bridge; a relayed rollout on the
emulator's path is the key tests' (``backend/test_rollouts.py``).

``rollout_fixtures.workflows:SecondCallWorkflow`` writes the policy's (wrong) answer, then makes
one more call: a body that is not JSON (which made the scripted policy drop the connection), or
one with a ``max_tokens`` the policy takes longer over than the relay waits. Each is the
rollout's own failure: the workflow gets an error answer, and the grader's reward 0 stands.
The positive control is the endpoint really going down between the two calls: that rollout is
the infrastructure's (``internal_error``). ``test_relay_blame`` holds the relay-level controls
(the same body sent straight to the policy drops the connection).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.backends import make_backend
from tests.support.common import graded_template
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

WRONG = "Write 42 to answer.txt\nreply: echo 7 > answer.txt"
RELAY_TIMEOUT_SEC = 4.0


@pytest.fixture
def policy() -> Iterator[FakeChatServer]:
    """A policy that takes 60 s over a call asking for a billion tokens, and answers others at once."""
    server = FakeChatServer(delay_for=lambda body: 60.0 if body.get("max_tokens", 0) > 100_000 else 0.0)
    yield server
    server.close()


@pytest.fixture
def failing_policy() -> Iterator[FakeChatServer]:
    """A policy that answers one call and then goes down (connections refused)."""
    server = FakeChatServer(answers_left=1)
    yield server
    server.close()


@DOCKER_PATH_ONLY
async def test_a_call_of_the_workflows_own_making_leaves_its_wrong_answer_a_reward_0(
    tmp_path, bundles_dir, policy, failing_policy, sandbox_sdk: SdkPath, monkeypatch
):
    sandbox_sdk.require_loopback_endpoint()
    monkeypatch.setenv("OSMOSIS_HARBOR_RELAY_TIMEOUT_SEC", str(RELAY_TIMEOUT_SEC))
    backend = make_backend(
        tmp_path,
        bundles_dir,
        agent="SecondCallWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path),
        sdk=sandbox_sdk,
    )
    calls = {"unparseable": policy, "slow": policy, "plain": failing_policy}
    async with serve(backend) as url, client_for(url) as client:
        results = dict(
            zip(
                calls,
                await asyncio.gather(
                    *(
                        client.run_rollout(
                            initial_messages=[{"role": "user", "content": f"{WRONG}\ncall: {kind}"}],
                            chat_completions_url=endpoint.base_url,
                            rollout_id=f"{kind}-{uuid.uuid4().hex[:6]}",
                            llm_api_key=f"sk-blame-{uuid.uuid4().hex}",
                            label="42",
                        )
                        for kind, endpoint in calls.items()
                    )
                ),
                strict=True,
            )
        )
    for kind, status in (("unparseable", 400), ("slow", 504)):
        result = results[kind]
        assert result.status is RolloutStatus.SUCCESS, (kind, result.err_category, result.err_message)
        assert result.sample.reward == 0.0
        assert result.sample.messages[-1]["content"] == f"second call refused {status}", result.sample.messages
    assert len(policy.requests) == 3  # both first calls and the slow one: the unparseable body never left the host

    # positive control: the endpoint went down between the calls, for everyone
    down = results["plain"]
    assert down.status is RolloutStatus.FAILURE
    assert down.err_category is RolloutErrorCategory.INTERNAL_ERROR, down.err_message
    assert "no fault of its own" in down.err_message and "unreachable" in down.err_message
    assert sandbox_sdk.sandboxes_left() == []
