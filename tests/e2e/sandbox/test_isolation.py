"""One sandbox cannot see or alter another's traffic on the bridge they share.

Every local sandbox joins one bridge (``osmosis-harbor-sandboxes``) with inter-container traffic
off, an iptables rule, which ARP is not subject to. With Docker's default capabilities, root in
a sandbox opens a packet socket, tells a neighbour the gateway is at its own MAC, and reads the
neighbour's requests to the policy relay (its token and ``Authorization`` header) while passing
them on. Sandboxes are created without NET_RAW, so the attack stops at the socket.

The attack (``fixtures/isolation/arp_attacker.py``) runs from one sandbox against another and
the gateway, while the victim (``arp_victim.py``) calls a server this test runs on the gateway's
address, as a workflow calls the relay. On the Docker path: the emulator's server makes its
sandboxes through the same Docker implementation, on the same bridge, with the same capabilities,
and the conformance suite's privileges check, run on both paths (``test_sandbox_check.py``),
fails where a sandbox keeps NET_RAW. The positive control runs the same attack through the
same create path on a bridge of the test's own, made with the same options, with the
capabilities left as Docker's: there the spoof pays (the victim's ARP table names the attacker, the secret is captured).
Only sandboxes and networks the tests make are touched.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox import load_sandbox_sdk
from osmosis_harbor.sandbox.conformance.core import ConformanceContext
from osmosis_harbor.sandbox.docker import network as sandbox_networks
from osmosis_harbor.sandbox.docker.engine import get_engine, sandbox_network
from osmosis_harbor.sandbox.sdk.privileges import SandboxPrivileges
from tests.support.common import FIXTURES
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = pytest.mark.slow

IMAGE = "python:3.12-slim"  # locally present; the attack and the victim are Python scripts
SCRIPTS = FIXTURES / "isolation"
ATTACK_SEC = 6
VICTIM_SEC = 4


class SecretServer:
    """An HTTP server on one host address (a bridge's gateway) counting requests that carry
    the secret: the stand-in for the policy relay."""

    def __init__(self, address: str, secret: str) -> None:
        self.received = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept-alive connections, as the relay's clients keep them

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.headers.get("Authorization") == f"Bearer {secret}":
                    outer.received += 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer((address, 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class Outcome:
    attacker: dict[str, Any]
    victim: dict[str, Any]
    attacker_mac: str
    gateway_mac: str
    host_saw_victim_at: str | None  # the host's ARP entry for the victim
    victim_mac: str
    received: int


def _bridge_mac(bridge: str) -> str:
    return Path(f"/sys/class/net/{bridge}/address").read_text().strip()


def _host_arp(ip: str) -> str | None:
    for line in Path("/proc/net/arp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[0] == ip:
            return fields[3]
    return None


async def _json(ctx: ConformanceContext, sandbox: Any, *argv: str, timeout: int = 60) -> dict[str, Any]:
    out = await ctx.run(sandbox, *argv, timeout=timeout)
    assert out.code == 0, f"{argv[1] if len(argv) > 1 else argv}: exit {out.code}: {out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


async def attack(ctx: ConformanceContext, gateway: str, bridge: str) -> Outcome:
    """The attacker and the victim in two fresh sandboxes of ``ctx``; the victim calls a server
    on ``gateway`` (an address of this host on ``bridge``) while the attacker spoofs."""
    victim, attacker = await asyncio.gather(ctx.new_sandbox("victim"), ctx.new_sandbox("attacker"))
    for sandbox, name in ((attacker, "arp_attacker.py"), (victim, "arp_victim.py")):
        await sandbox.write_bytes.aio((SCRIPTS / name).read_bytes(), f"/opt/{name}")
    where = "import socket, fcntl, struct; s = socket.socket(); print(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', b'eth0'))[20:24]), open('/sys/class/net/eth0/address').read().strip())"  # noqa: E501
    victim_ip, victim_mac = (await ctx.run(victim, "python3", "-c", where)).stdout.split()
    attacker_mac = (await ctx.run(attacker, "cat", "/sys/class/net/eth0/address")).stdout.strip()
    gateway_mac = _bridge_mac(bridge)
    secret = f"sk-victim-{secrets.token_hex(8)}"
    server = SecretServer(gateway, secret)
    try:
        spoofing = asyncio.ensure_future(
            _json(ctx, attacker, "python3", "/opt/arp_attacker.py", victim_ip, victim_mac, gateway, gateway_mac,
                  secret, str(ATTACK_SEC))
        )  # fmt: skip
        calls = await _json(ctx, victim, "python3", "/opt/arp_victim.py", gateway, str(server.port), secret,
                            str(VICTIM_SEC))  # fmt: skip
        spoofed = await spoofing
    finally:
        server.close()
    return Outcome(spoofed, calls, attacker_mac, gateway_mac, _host_arp(victim_ip), victim_mac, server.received)


@DOCKER_PATH_ONLY
async def test_a_sandbox_cannot_spoof_arp_or_read_its_neighbours_traffic(sandbox_sdk: SdkPath) -> None:
    ctx = ConformanceContext(sdk=load_sandbox_sdk(sandbox_sdk.name), image=IMAGE, settings=settings.current())
    bridge = sandbox_network()
    try:
        outcome = await attack(ctx, bridge.gateway, sandbox_networks.BRIDGE_INTERFACE)
    finally:
        await ctx.close()
    assert outcome.attacker == {"raw_ip": "PermissionError errno 1", "packet": "PermissionError errno 1"}
    assert outcome.victim["seen"] == [outcome.gateway_mac], outcome  # its ARP table never named the attacker
    assert outcome.victim["failed"] == 0 and outcome.victim["answered"] == outcome.received > 0, outcome
    assert outcome.host_saw_victim_at in (None, outcome.victim_mac), outcome


@pytest.fixture
def own_bridge() -> Iterator[tuple[str, str, str]]:
    """A bridge of this test's own, with the sandboxes' bridge's options: (network, gateway, interface)."""
    api = docker.from_env().api
    suffix = uuid.uuid4().hex[:6]
    interface = f"ohisoctl{suffix}"
    options = {**sandbox_networks.BRIDGE_OPTIONS, "com.docker.network.bridge.name": interface}
    created = api.create_network(f"osmosis-harbor-isolation-control-{suffix}", driver="bridge", options=options)
    try:
        data = api.inspect_network(created["Id"])
        gateway = data["IPAM"]["Config"][0]["Gateway"].split("/")[0]
        yield data["Name"], gateway, interface
    finally:
        api.remove_network(created["Id"])


async def test_positive_control_with_net_raw_kept_the_spoof_pays(
    docker_sandbox_sdk: Any, own_bridge: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protection switched off (Docker's default capabilities), on the test's own bridge."""
    name, gateway, interface = own_bridge
    engine = get_engine()
    monkeypatch.setattr(engine, "sandbox_bridge", lambda refresh=False: name)
    monkeypatch.setattr(
        SandboxPrivileges, "of", classmethod(lambda cls, _current: cls(cap_drop=(), no_new_privileges=False))
    )
    ctx = ConformanceContext(sdk=docker_sandbox_sdk, image=IMAGE, settings=settings.current())
    try:
        outcome = await attack(ctx, gateway, interface)
    finally:
        await ctx.close()
    assert outcome.attacker["packet"] == "opened" and outcome.attacker["raw_ip"] == "opened", outcome
    assert outcome.attacker["captured"] is True, outcome  # the victim's Authorization header, read
    assert outcome.attacker_mac in outcome.victim["seen"], outcome  # its ARP table named the attacker
