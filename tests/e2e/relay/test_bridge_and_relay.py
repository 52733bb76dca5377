"""The sandboxes' bridge and the policy relay, with real containers on the local engine.

Sandboxes join ``osmosis-harbor-sandboxes`` (inter-container traffic off) and reach the host
only through the relay on its gateway, which forwards a registered token's requests under its
chat URL's path to that one upstream, and refuses everything else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

import docker
import httpx
import pytest

from osmosis_harbor import settings
from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.errors import ConfigError, SandboxNetworkError
from osmosis_harbor.sandbox.docker.engine import sandbox_network
from osmosis_harbor.sandbox.docker.network import BRIDGE_INTERFACE, SANDBOX_NETWORK, ensure_sandbox_network
from osmosis_harbor.sandbox.relay.http import forwardable_path
from osmosis_harbor.sandbox.relay.limits import Blame, RelayAdmission, RelayLimits
from osmosis_harbor.sandbox.relay.policy_relay import PolicyRelay
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import wait_until

LISTENER_IMAGE = "python:3.13-slim"  # bootstrap's base images; the peer test needs a listener
PEER_PORT = 8731


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def make_sandbox(docker_sandbox_sdk: Any, sandbox_image: str) -> AsyncIterator[Any]:
    made: list[Any] = []

    async def factory(stem: str = "relay", **kwargs: Any) -> Any:
        kwargs.setdefault("image", sandbox_image)
        sandbox = await docker_sandbox_sdk.create.aio(name=unique(stem), timeout=300, **kwargs)
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        await sandbox.terminate.aio(wait=True)


@pytest.fixture
def relay() -> Iterator[PolicyRelay]:
    relay = PolicyRelay(config=settings.current())
    yield relay
    relay.close()


@pytest.fixture
def policies() -> Iterator[tuple[FakeChatServer, FakeChatServer]]:
    one, two = FakeChatServer(default_reply="from-one"), FakeChatServer(default_reply="from-two")
    yield one, two
    one.close()
    two.close()


async def run(sandbox: Any, *argv: str) -> tuple[int, str]:
    handle = await sandbox.exec.aio(*argv, timeout_seconds=60)
    code = await handle.wait()
    return code, handle.stdout.read() + handle.stderr.read()


def http_from_sandbox(url: str, *, authorization: str = "Bearer sk-x") -> list[str]:
    """argv that POSTs a chat request to ``url`` with bash's /dev/tcp (the image has no curl):
    HTTP/1.0, so the relay closes the connection after its answer."""
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    body = '{"model":"p","messages":[{"role":"user","content":"hi"}]}'
    request = (
        f"POST /{path} HTTP/1.0\\r\\nHost: {hostport}\\r\\nAuthorization: {authorization}\\r\\n"
        f"Content-Type: application/json\\r\\nContent-Length: {len(body)}\\r\\n\\r\\n{body}"
    )
    script = f"exec 3<>/dev/tcp/{host}/{port} && printf '%b' '{request}' >&3 && cat <&3"
    return ["timeout", "20", "bash", "-c", script]


def status_of(output: str) -> int:
    first = output.splitlines()[0] if output else ""
    assert first.startswith("HTTP/1."), output
    return int(first.split()[1])


# ── the network ──────────────────────────────────────────────────────────────────────────────


async def test_sandboxes_join_their_own_bridge_without_icc(make_sandbox: Any) -> None:
    first, second = sandbox_network(), sandbox_network()
    assert first == second and first.name == SANDBOX_NETWORK  # idempotent, by name
    data = docker.from_env().api.inspect_network(SANDBOX_NETWORK)
    assert data["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert data["Options"]["com.docker.network.bridge.name"] == BRIDGE_INTERFACE
    assert data["Labels"]["osmosis-harbor.managed"] == "1"
    sandbox = await make_sandbox()
    attached = docker.from_env().api.inspect_container(sandbox.id)["NetworkSettings"]["Networks"]
    assert set(attached) == {SANDBOX_NETWORK}
    blocked = await make_sandbox(block_network=True)
    attached = docker.from_env().api.inspect_container(blocked.id)["NetworkSettings"]["Networks"]
    assert set(attached) == {"none"}


def test_a_network_of_that_name_that_lets_sandboxes_talk_is_refused(docker_sandbox_sdk: Any) -> None:
    api = docker.from_env().api
    name = unique("ohtest-icc")
    api.create_network(name, driver="bridge")  # Docker's defaults: inter-container traffic allowed
    try:
        with pytest.raises(SandboxNetworkError, match=f"{name}.*enable_icc"):
            ensure_sandbox_network(api, name)
    finally:
        api.remove_network(name)


async def test_pool_members_join_the_bridge_too(docker_sandbox_sdk: Any, sandbox_image: str) -> None:
    pool = unique("relaypool")
    await docker_sandbox_sdk.create_pool.aio(pool, sandbox_image, replicas=1)
    try:
        claimed = await docker_sandbox_sdk.create.aio(name=unique("relayclaim"), pool=pool, timeout=300)
        try:
            attached = docker.from_env().api.inspect_container(claimed.id)["NetworkSettings"]["Networks"]
            assert set(attached) == {SANDBOX_NETWORK}
        finally:
            await claimed.terminate.aio(wait=True)
    finally:
        await docker_sandbox_sdk.delete_pool.aio(pool)


async def test_two_sandboxes_cannot_reach_each_other(make_sandbox: Any) -> None:
    listener = await make_sandbox("peer-a", image=LISTENER_IMAGE)
    other = await make_sandbox("peer-b", image=LISTENER_IMAGE)
    serve = f"nohup python3 -m http.server {PEER_PORT} --bind 0.0.0.0 >/dev/null 2>&1 &"
    assert (await run(listener, "bash", "-c", serve))[0] == 0
    probe = f"(exec 3<>/dev/tcp/127.0.0.1/{PEER_PORT}) 2>/dev/null"
    wait_ready = f"for i in $(seq 200); do {probe} && exit 0; sleep 0.05; done; exit 1"  # poll until it listens
    assert (await run(listener, "bash", "-c", wait_ready))[0] == 0
    networks = docker.from_env().api.inspect_container(listener.id)["NetworkSettings"]["Networks"]
    address = networks[SANDBOX_NETWORK]["IPAddress"]
    url = f"http://{address}:{PEER_PORT}/"
    # positive control: the listener answers on its bridge address (to the host, and to itself)
    assert httpx.get(url, timeout=10, trust_env=False).status_code == 200
    code, _ = await run(listener, "timeout", "10", "bash", "-c", f"exec 3<>/dev/tcp/{address}/{PEER_PORT}")
    assert code == 0
    code, _ = await run(other, "timeout", "5", "bash", "-c", f"exec 3<>/dev/tcp/{address}/{PEER_PORT}")
    assert code != 0, "a sandbox reached another sandbox on the sandboxes' bridge"


# ── the relay, from a sandbox ────────────────────────────────────────────────────────────────


async def test_the_relay_forwards_only_a_tokens_chat_path_to_its_own_upstream(
    make_sandbox: Any, relay: PolicyRelay, policies: tuple[FakeChatServer, FakeChatServer]
) -> None:
    one, two = policies
    first = await relay.register(one.base_url)
    second = await relay.register(two.base_url)
    assert first.token != second.token and first.token not in one.base_url
    assert first.sandbox_url.endswith(f"/{first.token}/v1")
    sandbox = await make_sandbox()

    code, out = await run(sandbox, *http_from_sandbox(first.sandbox_url + "/chat/completions"))
    assert code == 0 and status_of(out) == 200 and "from-one" in out
    code, out = await run(sandbox, *http_from_sandbox(second.sandbox_url + "/chat/completions"))
    assert code == 0 and status_of(out) == 200 and "from-two" in out
    assert [(r.path, r.authorization) for r in one.requests] == [("/v1/chat/completions", "Bearer sk-x")]
    assert [r.path for r in two.requests] == ["/v1/chat/completions"]  # each token reaches its own upstream

    base = first.sandbox_url.rsplit("/v1", 1)[0]  # http://gateway:port/<token>
    outside = ["/admin", "/v1/../admin", "/v1/%2e%2e/admin", "/v1%2fchat", "/v10/chat/completions", "/"]
    for path in outside:
        code, out = await run(sandbox, *http_from_sandbox(base + path))
        assert status_of(out) == 404, (path, out)
    unknown = base.rsplit("/", 1)[0] + "/" + "x" * len(first.token) + "/v1/chat/completions"
    assert status_of((await run(sandbox, *http_from_sandbox(unknown)))[1]) == 403
    first.close()  # the rollout ended: its URL is dead, the other rollout's is not
    assert status_of((await run(sandbox, *http_from_sandbox(first.sandbox_url + "/chat/completions")))[1]) == 403
    assert status_of((await run(sandbox, *http_from_sandbox(second.sandbox_url + "/chat/completions")))[1]) == 200
    assert len(one.requests) == 1 and len(two.requests) == 2  # nothing refused reached an upstream


# ── the relay's bounds (from the host, on the gateway) ───────────────────────────────────────


async def test_request_and_response_sizes_are_bounded(policies: tuple[FakeChatServer, FakeChatServer]) -> None:
    one, _ = policies
    relay = PolicyRelay(
        limits=RelayLimits(max_request_bytes=16_384, max_response_bytes=4096, timeout_sec=30), config=settings.current()
    )
    try:
        registration = await relay.register(one.base_url)
        url = registration.sandbox_url + "/chat/completions"
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            small = {"model": "p", "messages": [{"role": "user", "content": "reply: ok"}]}
            assert (await client.post(url, json=small)).json()["choices"][0]["message"]["content"] == "ok"
            big = {"model": "p", "messages": [{"role": "user", "content": "x" * 32_768}]}
            assert (await client.post(url, json=big)).status_code == 413
            flood = {"model": "p", "messages": [{"role": "user", "content": "reply: " + "y" * 8192}]}
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(url, json=flood)  # the upstream answered; the relay cut it off
        assert len(one.requests) == 2  # the oversized request never reached the upstream
    finally:
        relay.close()


def test_forwardable_path() -> None:
    assert forwardable_path("/v1/chat/completions", "/v1")
    assert forwardable_path("/v1", "/v1")
    assert forwardable_path("/anything", "")
    for path in ("/v1/../x", "/v1/%2E%2E/x", "/v1/./x", "/v1%2Fx", "/v1\\..\\x", "/v10", "/", "/v1/%00"):
        assert not forwardable_path(path, "/v1"), path


# ── the decision: which rollouts go through the relay ───────────────────────────────────────


@pytest.mark.parametrize(
    ("agent", "native", "env", "url", "relayed", "refused"),
    [
        ("wf:Flow", False, {"sdk": "docker"}, "http://127.0.0.1:9/v1", True, False),
        ("wf:Flow", False, {"sdk": "docker"}, "http://localhost:9/v1", True, False),
        ("wf:Flow", False, {"sdk": "docker", "host_network": True}, "http://127.0.0.1:9/v1", False, False),
        ("wf:Flow", False, {"sdk": "docker"}, "https://policy.example.com/v1", False, False),
        ("wf:Flow", False, {"sdk": "skypilot"}, "http://127.0.0.1:9/v1", False, True),
        ("mini-swe-agent", True, {"sdk": "docker"}, "http://127.0.0.1:9/v1", True, False),
        ("terminus-2", True, {"sdk": "docker"}, "http://127.0.0.1:9/v1", False, False),  # calls from the host
        ("terminus-2", True, {"sdk": "skypilot"}, "http://127.0.0.1:9/v1", False, False),
        ("oracle", True, {"sdk": "docker"}, "", False, False),
    ],
)
def test_which_rollouts_the_relay_carries(
    agent: str, native: bool, env: dict[str, Any], url: str, relayed: bool, refused: bool
) -> None:
    from harbor.models.trial.config import EnvironmentConfig

    from osmosis_harbor.backend.admission import endpoint_problem, relays_endpoint
    from osmosis_harbor.sandbox.environment.sandbox_environment import IMPORT_PATH

    options = cast(BackendOptions, SimpleNamespace(agent=agent, is_native=native))
    environment = EnvironmentConfig(import_path=IMPORT_PATH, kwargs=env)
    assert relays_endpoint(options, environment, url) is relayed
    assert (endpoint_problem(options, environment, url) is not None) is refused


class _Streaming:
    """An upstream that sends one event, then holds the response open until ``release`` is
    set: a relay that buffered would deliver nothing before the hold ends."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held_to_the_end = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b"data: one\n\n")
                self.wfile.flush()
                outer.held_to_the_end = not outer.release.wait(60)
                self.wfile.write(b"data: two\n\n")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


async def test_responses_are_streamed_through(relay: PolicyRelay) -> None:
    upstream = _Streaming()
    try:
        registration = await relay.register(f"http://127.0.0.1:{upstream.server.server_address[1]}/v1")
        async with httpx.AsyncClient(trust_env=False, timeout=90) as client:
            url = registration.sandbox_url + "/chat/completions"
            async with client.stream("POST", url, json={"stream": True}) as response:
                chunks = response.aiter_bytes()
                first = await anext(chunks)
                upstream.release.set()  # only now may the upstream finish
                rest = b"".join([chunk async for chunk in chunks])
        assert first == b"data: one\n\n" and rest == b"data: two\n\n"
        assert not upstream.held_to_the_end  # the first event came through while the upstream held
    finally:
        upstream.close()


async def test_closing_ends_calls_in_flight_at_once_and_leaves_logging_alone() -> None:
    """A rollout server stops its relay during shutdown, while a cancelled rollout's call may
    still wait on the policy: the call gets a 503 and the relay stops without waiting for it.
    And starting the relay must not reconfigure the process's logging (the server's drain logs
    through uvicorn's logger)."""
    arrived, release = threading.Event(), threading.Event()

    class Holding(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            arrived.set()
            release.wait(120)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    uvicorn_error = logging.getLogger("uvicorn.error")
    uvicorn_error.setLevel(logging.INFO)
    relay = PolicyRelay(config=settings.current())
    try:
        registration = await relay.register(f"http://127.0.0.1:{upstream.server_address[1]}/v1")
        assert uvicorn_error.level == logging.INFO and uvicorn_error.isEnabledFor(logging.INFO)
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            call = asyncio.create_task(client.post(registration.sandbox_url + "/chat/completions", json={}))
            assert await asyncio.to_thread(arrived.wait, 60)  # the call waits on the upstream now
            thread = relay._thread
            await relay.aclose()
            assert thread is not None and not thread.is_alive()
            assert (await call).status_code == 503
    finally:
        release.set()
        relay.close()
        upstream.shutdown()
        upstream.server_close()


# ── the relay's admission: bounds per sandbox and per rollout, and whose fault a refusal is ──


def test_admission_keeps_a_share_for_light_sandboxes_and_blames_the_greedy() -> None:
    limits = RelayLimits(
        max_connections=10,
        reserved_connections=4,
        max_source_connections=8,
        max_token_calls=2,
        max_request_bytes=100,
        max_token_buffered_bytes=200,
        max_buffered_bytes=500,
    )
    admission = RelayAdmission(limits)
    greedy = "10.0.0.2"
    assert all(admission.connect(greedy) is None for _ in range(6))  # up to the reserve
    refused = admission.connect(greedy)
    assert refused is not None and (refused.blame, refused.kind) == (Blame.OWN, "busy_source")
    light = [f"10.0.1.{n}" for n in range(4)]
    assert all(admission.connect(source) is None for source in light)  # the reserve is theirs
    full = admission.connect("10.0.2.1")  # a newcomer finds the relay full: not its fault
    assert full is not None and (full.blame, full.kind) == (Blame.INFRA, "relay_full")
    assert admission.stats()["connections"] == 10 and admission.stats()["overflow"] == 1
    admission.disconnect("10.0.2.1", overflow=True)
    for _ in range(6):
        admission.disconnect(greedy)
    assert admission.stats() == {**admission.stats(), "connections": 4, "overflow": 0, "sources": 4}

    roomy = RelayAdmission(RelayLimits(max_connections=100, reserved_connections=0, max_source_connections=3))
    assert all(roomy.connect(greedy) is None for _ in range(3))
    over = roomy.connect(greedy)
    assert over is not None and (over.blame, over.kind) == (Blame.OWN, "source_connections")

    assert admission.begin_call("t1") is None and admission.begin_call("t1") is None
    calls = admission.begin_call("t1")
    assert calls is not None and (calls.blame, calls.kind) == (Blame.OWN, "token_calls")
    assert admission.begin_call("t2") is None  # another rollout's calls are its own

    assert admission.hold("t1", 100) is None and admission.hold("t1", 100) is None
    mine = admission.hold("t1", 1)
    assert mine is not None and (mine.blame, mine.kind) == (Blame.OWN, "token_buffered")
    assert admission.hold("t2", 100) is None  # 300 of 500 held: the last 200 are the reserve
    busy = admission.hold("t2", 1)  # t2 already holds something: not from the reserve
    assert busy is not None and (busy.blame, busy.kind) == (Blame.OWN, "busy_buffers")
    assert admission.hold("t3", 100) is None  # a rollout holding nothing uses the reserve
    starved = admission.hold("t4", 101)  # 400 of 500 held by others: the relay's fault, not t4's
    assert starved is not None and (starved.blame, starved.kind) == (Blame.INFRA, "buffers_full")
    admission.release("t1", 200)
    assert admission.hold("t4", 100) is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"reserved_connections": 10, "max_connections": 10}, "relay_reserved_connections"),
        ({"max_token_buffered_bytes": 4096, "max_buffered_bytes": 4096}, "relay_max_token_buffered_bytes"),
        ({"max_request_bytes": 4096, "max_token_buffered_bytes": 2048}, "relay_max_request_bytes"),
    ],
)
def test_contradictory_relay_limits_are_refused(changes: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RelayLimits(**{"max_buffered_bytes": 8192, "max_token_buffered_bytes": 4096, **changes})


@pytest.fixture
def host_relay() -> Iterator[Callable[..., PolicyRelay]]:
    """Relays on 127.0.0.1 with the limits a test gives (every call from the host is one source)."""
    made: list[PolicyRelay] = []

    def make(**limits: Any) -> PolicyRelay:
        relay = PolicyRelay(bind_host=lambda: "127.0.0.1", limits=RelayLimits(**limits), config=settings.current())
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.close()


def raw_connection(url: str) -> tuple[socket.socket, str, str]:
    """A plain socket to the relay of ``url``: (socket, host:port, path with the token)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return socket.create_connection((parts.hostname, parts.port), timeout=30), parts.netloc, parts.path


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the relay sends until it closes the connection (it must, within the socket's timeout)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


async def test_a_head_that_never_ends_is_closed_at_the_header_timeout(
    host_relay: Callable[..., PolicyRelay], policies: tuple[FakeChatServer, FakeChatServer]
) -> None:
    relay = host_relay(header_timeout_sec=0.5)
    registration = await relay.register(policies[0].base_url)
    sock, hostport, path = raw_connection(registration.sandbox_url)
    with sock:
        sock.sendall(f"POST {path}/chat/completions HTTP/1.1\r\nHost: {hostport}\r\n".encode())  # no blank line
        started = time.monotonic()
        assert await asyncio.to_thread(read_until_closed, sock) == b""  # closed, nothing answered
        assert time.monotonic() - started >= 0.4
    wait_until(lambda: relay.stats()["connections"] == 0, timeout=30, what="the relay to let the connection go")
    assert policies[0].requests == []


async def test_a_body_that_never_ends_is_refused_at_the_body_timeout_as_the_rollouts_fault(
    host_relay: Callable[..., PolicyRelay], policies: tuple[FakeChatServer, FakeChatServer]
) -> None:
    relay = host_relay(body_timeout_sec=0.5)
    registration = await relay.register(policies[0].base_url)
    sock, hostport, path = raw_connection(registration.sandbox_url)
    with sock:
        head = f"POST {path}/chat/completions HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 100\r\n\r\n"
        sock.sendall(head.encode() + b"{" * 99)  # one byte short, held
        answer = await asyncio.to_thread(read_until_closed, sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    report = registration.record.report()
    assert report.own == {"body_timeout": 1} and report.failure is None
    wait_until(lambda: relay.stats()["connections"] == 0, timeout=30, what="the relay to let the connection go")
    assert relay.stats()["buffered_bytes"] == 0 and relay.stats()["received_bytes"] == 0
    assert policies[0].requests == []  # the upstream never saw a partial body


async def test_a_rollouts_calls_in_flight_are_bounded_and_its_own_refusals(
    host_relay: Callable[..., PolicyRelay], policies: tuple[FakeChatServer, FakeChatServer]
) -> None:
    relay = host_relay(max_token_calls=2)
    flooder, other = await relay.register(policies[0].base_url), await relay.register(policies[1].base_url)
    held = [raw_connection(flooder.sandbox_url) for _ in range(2)]
    try:
        for sock, hostport, path in held:  # two calls whose bodies never come: in flight
            sock.sendall(
                f"POST {path}/chat/completions HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 10\r\n\r\n".encode()
            )
        wait_until(lambda: relay.stats()["calls"] == 2, timeout=30, what="two calls in flight")
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            third = await client.post(flooder.sandbox_url + "/chat/completions", json={})
            assert third.status_code == 429 and "calls in flight" in third.text
            theirs = await client.post(other.sandbox_url + "/chat/completions", json={"messages": []})
            assert theirs.status_code == 200  # another rollout's calls are not bounded by this one's
    finally:
        for sock, _, _ in held:
            sock.close()
    assert flooder.record.report().own == {"token_calls": 1} and flooder.record.report().failure is None
    assert other.record.report().own == {} and policies[0].requests == []


async def test_a_refusal_through_no_fault_of_the_rollout_is_its_failure_until_an_answer(
    host_relay: Callable[..., PolicyRelay], policies: tuple[FakeChatServer, FakeChatServer]
) -> None:
    """Two connections fill this relay (the host is one light source): the third is answered
    503 and recorded against its token as the relay's failure, and a later answered call
    recovers it. An unreachable policy endpoint is the infrastructure's failure too."""
    relay = host_relay(max_connections=2, reserved_connections=1)
    registration = await relay.register(policies[0].base_url)
    url = registration.sandbox_url + "/chat/completions"
    holders = [raw_connection(registration.sandbox_url)[0] for _ in range(2)]
    wait_until(lambda: relay.stats()["connections"] == 2, timeout=30, what="the relay to hold two connections")
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        refused = await client.post(url, json={})
        assert refused.status_code == 503 and "the relay is full" in refused.text
        report = registration.record.report()
        assert report.infra == {"relay_full": 1} and report.failure is not None
        message = report.failure_message()
        assert message is not None and "no fault of its own" in message and "the relay is full" in message
        for sock in holders:
            sock.close()
        wait_until(lambda: relay.stats()["connections"] == 0, timeout=30, what="the relay to let the holders go")
        answered = await client.post(url, json={"messages": [{"role": "user", "content": "reply: ok"}]})
        assert answered.status_code == 200
        assert registration.record.report().failure is None  # recovered; still counted
        assert registration.record.report().infra == {"relay_full": 1}

        dead = await relay.register("http://127.0.0.1:9/v1")  # nothing listens on the discard port
        unreachable = await client.post(dead.sandbox_url + "/chat/completions", json={})
        assert unreachable.status_code == 502
        assert dead.record.report().infra == {"upstream_unreachable": 1} and dead.record.report().failure


async def test_a_sandbox_that_stops_reading_its_answer_is_dropped(
    host_relay: Callable[..., PolicyRelay], policies: tuple[FakeChatServer, FakeChatServer]
) -> None:
    relay = host_relay(body_timeout_sec=2.0)
    registration = await relay.register(policies[0].base_url)
    parts = urlsplit(registration.sandbox_url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it reads nothing: the answer backs up
    with sock:
        sock.connect((parts.hostname, parts.port))
        body = json.dumps({"messages": [{"role": "user", "content": "reply: " + "y" * 4_000_000}]}).encode()
        head = f"POST {parts.path}/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        wait_until(lambda: relay.stats()["calls"] == 1, timeout=30, what="the call to be answered")
        wait_until(lambda: relay.stats()["connections"] == 0, timeout=30, what="the stalled reader to be dropped")
    assert len(policies[0].requests) == 1
