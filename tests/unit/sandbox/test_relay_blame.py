"""Whose fault a relayed call's failure is, decided by what the host saw (``relay/blame.py``):
a relay on 127.0.0.1, the scripted policy and hostile upstreams on 127.0.0.1, calls from the host.

Each call the sandbox's own request failed (a body that is not JSON, a body the upstream chokes
on, parameters that make it outlast the relay's timeout) is counted as the rollout's own and
leaves no failure on its record; each positive control is the endpoint really failing everyone
(connections refused, nothing answering, not even the probe), which stays the infrastructure's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox.relay.limits import RelayLimits
from osmosis_harbor.sandbox.relay.policy_relay import PolicyRelay
from osmosis_harbor.testing.scripted_policy import FakeChatServer

NOT_JSON = b'{"model": "p", "messages": [{"role": "user", "content": "x"}'  # cut short


@pytest.fixture
def host_relay() -> Iterator[Callable[..., PolicyRelay]]:
    made: list[PolicyRelay] = []

    def make(**limits: Any) -> PolicyRelay:
        relay = PolicyRelay(bind_host=lambda: "127.0.0.1", limits=RelayLimits(**limits), config=settings.current())
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.close()


@pytest.fixture
def policy() -> Iterator[FakeChatServer]:
    server = FakeChatServer(default_reply="ok")
    yield server
    server.close()


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint that accepts connections and never answers anything: down for everyone."""
    release = threading.Event()

    class Mute(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            release.wait(60)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Mute)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    release.set()
    server.shutdown()
    server.server_close()


async def test_a_body_that_is_not_json_is_refused_before_the_upstream_and_is_the_calls_own(
    host_relay: Callable[..., PolicyRelay], policy: FakeChatServer
) -> None:
    relay = host_relay(timeout_sec=30)
    registration = await relay.register(policy.base_url)
    url = registration.sandbox_url + "/chat/completions"
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        for body, content_type in ((NOT_JSON, "application/json"), (NOT_JSON, None), (b'{"x": NaN}', None)):
            headers = {"content-type": content_type} if content_type else {}
            refused = await client.post(url, content=body, headers=headers)
            assert refused.status_code == 400 and "not valid JSON" in refused.text, refused.text
        lone = await client.post(url, content=b'{"messages": [{"role": "user", "content": "\\ud800"}]}')
        assert lone.status_code == 400 and "lone surrogate" in lone.text
        assert policy.requests == []  # none reached the upstream
        report = registration.record.report()
        assert report.own == {"body_not_json": 4} and report.infra == {} and report.failure is None
        answered = await client.post(url, json={"messages": [{"role": "user", "content": "reply: fine"}]})
        assert answered.status_code == 200 and len(policy.requests) == 1

    # positive control: the same body sent to the upstream directly makes it drop the connection
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(policy.base_url + "/chat/completions", content=NOT_JSON)


async def test_a_call_the_upstream_drops_while_it_answers_others_is_the_calls_own(
    host_relay: Callable[..., PolicyRelay], policy: FakeChatServer
) -> None:
    """A body the relay forwards (declared as another type) that the upstream chokes on: the
    endpoint answers a probe, so the dropped call was the request's doing."""
    relay = host_relay(timeout_sec=30)
    registration = await relay.register(policy.base_url)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        dropped = await client.post(
            registration.sandbox_url + "/chat/completions", content=NOT_JSON, headers={"content-type": "text/plain"}
        )
    assert dropped.status_code == 502 and "while it answers others" in dropped.text, dropped.text
    report = registration.record.report()
    assert report.own == {"call_dropped": 1} and report.failure is None


async def test_a_call_slow_by_its_own_parameters_is_its_own_and_a_silent_endpoint_is_not(
    host_relay: Callable[..., PolicyRelay], policy: FakeChatServer, silent: str
) -> None:
    policy.delay_for = lambda body: 30.0 if body.get("max_tokens", 0) > 100_000 else 0.0
    relay = host_relay(timeout_sec=2)
    registration = await relay.register(policy.base_url)
    url = registration.sandbox_url + "/chat/completions"
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        slow = await client.post(url, json={"max_tokens": 10**9, "messages": [{"role": "user", "content": "x"}]})
        assert slow.status_code == 504 and "own parameters" in slow.text, slow.text
        report = registration.record.report()
        assert report.own == {"call_timeout": 1} and report.failure is None

        # positive control: an endpoint that answers nothing, not even the probe, failed everyone
        down = await relay.register(silent)
        late = await client.post(down.sandbox_url + "/chat/completions", json={"messages": []})
        assert late.status_code == 504 and "answers no probe" in late.text, late.text
        assert down.record.report().infra == {"upstream_timeout": 1} and down.record.report().failure


async def test_an_endpoint_gone_down_is_the_infrastructures(
    host_relay: Callable[..., PolicyRelay], policy: FakeChatServer
) -> None:
    """Connections refused before a byte of the request was sent: whatever the call held."""
    policy.answers_left = 1
    relay = host_relay(timeout_sec=30)
    registration = await relay.register(policy.base_url)
    url = registration.sandbox_url + "/chat/completions"
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        assert (await client.post(url, json={"messages": []})).status_code == 200
        gone = await client.post(url, json={"messages": []})
    assert gone.status_code == 502, gone.text
    report = registration.record.report()
    assert report.infra == {"upstream_unreachable": 1} and report.failure is not None
