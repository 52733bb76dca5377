"""The Docker bridge network local sandboxes attach to, instead of the host's network.

SkyPilot sandboxes reach the internet and cannot reach each other; local sandboxes should
behave the same and must not see the host's loopback services (the rollout server's own
cancel API, the local registry). So every networked sandbox and pool member joins one
labelled bridge, ``osmosis-harbor-sandboxes``, created on first use with inter-container
traffic disabled (``enable_icc=false``) and masquerading on (the internet stays reachable).
The host is reached on the bridge's gateway address only where something listens on it: the
policy relay (``osmosis_harbor.sandbox.relay.policy_relay``). Anything that creates containers for
sandboxes on this engine (the SkyPilot emulator too) calls ``engine.sandbox_network()`` so that
all of them share the network and the gateway the relay listens on.

The network lives in the engine, like everything else of this emulation, so any process finds
it by name; creation is idempotent across processes (the engine's duplicate check, and if two
creations still race, the oldest network of that name wins and the other is removed).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import docker.errors

from osmosis_harbor.errors import SandboxNetworkError
from osmosis_harbor.sandbox.docker import labels as L

__all__ = [
    "BRIDGE_INTERFACE",
    "BRIDGE_OPTIONS",
    "SANDBOX_NETWORK",
    "SandboxNetwork",
    "ensure_sandbox_network",
]

log = logging.getLogger(__name__)

SANDBOX_NETWORK = "osmosis-harbor-sandboxes"
# The host-side interface, named so a firewall rule can name it (see docs/threat-model.md).
BRIDGE_INTERFACE = "osmosis-sbx0"
NETWORK_ROLE = f"{L.PREFIX}.network-role"
BRIDGE_OPTIONS = {
    "com.docker.network.bridge.name": BRIDGE_INTERFACE,
    "com.docker.network.bridge.enable_icc": "false",
    "com.docker.network.bridge.enable_ip_masquerade": "true",
}
_guard = threading.Lock()


@dataclass(frozen=True)
class SandboxNetwork:
    """The bridge sandboxes join: its name (``network_mode``) and the host's address on it."""

    name: str
    gateway: str


def ensure_sandbox_network(api: Any, name: str = SANDBOX_NETWORK) -> SandboxNetwork:
    """Find or create the bridge called ``name``; checked on every call (cheap), so a network
    pruned under a long-running server is recreated rather than failing every create."""
    with _guard:
        found = _find(api, name)
        if found is None:
            found = _create(api, name)
    return _describe(found)


def _find(api: Any, name: str) -> dict[str, Any] | None:
    """The oldest network called exactly ``name`` (the engine's name filter matches substrings)."""
    same = [n for n in api.networks(names=[name]) if n.get("Name") == name]
    if not same:
        return None
    same.sort(key=lambda n: (str(n.get("Created", "")), str(n.get("Id", ""))))
    return dict(api.inspect_network(same[0]["Id"]))


def _create(api: Any, name: str) -> dict[str, Any]:
    try:
        created = api.create_network(
            name,
            driver="bridge",
            options=BRIDGE_OPTIONS,
            labels={L.MANAGED: "1", NETWORK_ROLE: "sandboxes"},
            check_duplicate=True,
        )
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: another process created it first
            raise SandboxNetworkError(f"cannot create the sandboxes' Docker network {name!r}: {exc}") from exc
        created = None
    winner = _find(api, name)
    if winner is None:
        raise SandboxNetworkError(f"Docker network {name!r} vanished right after it was created; retry")
    if created is not None and created.get("Id") != winner["Id"]:
        log.info("another process created network %s at the same time; using the older one", name)
        try:
            api.remove_network(created["Id"])
        except docker.errors.APIError:
            log.debug("could not remove the duplicate network %s", created["Id"], exc_info=True)
    return winner


def _describe(data: dict[str, Any]) -> SandboxNetwork:
    name = str(data.get("Name", ""))
    if data.get("Driver") != "bridge":
        raise SandboxNetworkError(
            f"Docker network {name!r} uses the {data.get('Driver')!r} driver, not 'bridge': remove it "
            f"(docker network rm {name}) and osmosis-harbor recreates it"
        )
    options = data.get("Options") or {}
    wrong = sorted(key for key, value in BRIDGE_OPTIONS.items() if options.get(key) != value)
    if wrong:  # e.g. made by hand with sandbox-to-sandbox traffic allowed
        raise SandboxNetworkError(
            f"Docker network {name!r} is not the one osmosis-harbor makes ({', '.join(wrong)} differ): "
            f"remove it (docker network rm {name}) and osmosis-harbor recreates it"
        )
    configs = ((data.get("IPAM") or {}).get("Config")) or []
    gateway = next((c.get("Gateway") for c in configs if c.get("Gateway") and ":" not in c["Gateway"]), None)
    if not gateway:
        raise SandboxNetworkError(f"Docker network {name!r} has no IPv4 gateway: the policy relay cannot listen on it")
    return SandboxNetwork(name=name, gateway=str(gateway).split("/")[0])
