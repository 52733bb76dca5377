"""What the engine holds for the Docker emulation: managed containers, claim volumes, records.

All sandbox state lives in the engine (labels, names, labelled volumes); these helpers list
and remove it for the facade, the pools and the reaper alike.
"""

from __future__ import annotations

from typing import Any

import docker.errors
from docker import APIClient

from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker.labels import ContainerInfo, RemovedContainer

__all__ = [
    "claim_volume_name",
    "dangling_tmp_volumes",
    "is_running",
    "list_claims",
    "list_containers",
    "removed_record",
    "remove_volume",
    "volumes",
]


def claim_volume_name(container_id: str) -> str:
    """Derived from the container id so terminate() finds it without a listing."""
    return f"{L.CLAIM_VOLUME_PREFIX}{container_id[:32]}"


def volumes(api: APIClient, label: str) -> list[dict[str, Any]]:
    return api.volumes(filters={"label": [L.MANAGED_FILTER, label]}).get("Volumes") or []


def list_claims(api: APIClient) -> dict[str, dict[str, str]]:
    """Claim records by container id."""
    claims: dict[str, dict[str, str]] = {}
    for vol in volumes(api, L.CLAIM_OF):
        labels = vol.get("Labels") or {}
        claims[labels.get(L.CLAIM_OF, "")] = labels
    return claims


def list_containers(api: APIClient, *, pool: str | None = None) -> list[ContainerInfo]:
    """Every managed container (any state) with its claim merged in.

    Claims are listed before containers: a claim whose container is missing from the later
    listing is then certainly orphaned (claims are created only for existing containers).
    """
    claims = list_claims(api)
    filters = [L.MANAGED_FILTER] + ([f"{L.POOL}={pool}"] if pool else [])
    summaries = api.containers(all=True, filters={"label": filters})
    return [ContainerInfo.from_summary(s, claims.get(s["Id"])) for s in summaries]


def remove_volume(api: APIClient, name: str) -> None:
    try:
        api.remove_volume(name, force=True)
    except docker.errors.NotFound:
        pass


def dangling_tmp_volumes(api: APIClient) -> list[str]:
    """Names of sandbox /tmp volumes no container refers to any more (the engine's own test:
    a volume in use, even by a stopped container, is never dangling)."""
    found = api.volumes(filters={"label": [L.MANAGED_FILTER, L.TMP_VOLUME], "dangling": True}).get("Volumes") or []
    return [vol["Name"] for vol in found]


def is_running(info: ContainerInfo) -> bool:
    return info.state == "running"


def removed_record(info: ContainerInfo, reason: str) -> RemovedContainer:
    return RemovedContainer(name=info.name, container_id=info.id, reason=reason, pool=info.pool)
