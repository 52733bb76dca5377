"""Which live processes use a task image, so that no clean-up removes it from under them.

Task images are content-addressed (``osmosis-harbor/env:<hash>``, ``.../osmosis-harbor-env:<hash>``),
so two processes on one engine (a test suite and a bench run, two servers) that run the same
environment share one image. One process removing "the images it built" took it from the other
mid-rollout (``ImageNotFoundError`` on its next create). A process that uses an image therefore
holds it: a Docker volume labelled with the image and the process (host, pid, start time), made
once per image per process; volumes are engine-wide, so every process on the engine sees every
hold. `remove_unheld` removes an image only when no other live process holds it; a dead
process's hold is dropped when it is seen. A container using the image makes the engine refuse
the removal as well (it is never forced).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from osmosis_harbor.errors import DockerSdkMissingError
from osmosis_harbor.owner_process import OwnerProcess
from osmosis_harbor.sandbox.images.docker_py import docker_py

__all__ = ["HOLD_LABEL", "hold", "holders", "remove_unheld"]

log = logging.getLogger(__name__)

HOLD_LABEL = "osmosis-harbor.image-hold"
_VOLUME_PREFIX = "ohimage_"


def _client() -> Any:  # docker.DockerClient: docker-py is untyped, and imported only when asked
    return docker_py().from_env()


def _volume_name(ref: str, owner: OwnerProcess) -> str:
    return f"{_VOLUME_PREFIX}{hashlib.sha256(ref.encode()).hexdigest()[:16]}_{owner.pid}"


def hold(ref: str) -> None:
    """Record that this process uses ``ref`` (idempotent; a dead predecessor's hold of the same
    pid is replaced). Dead processes' holds of any image go at the same time, so they do not
    pile up on the engine."""
    try:
        docker = docker_py()
    except DockerSdkMissingError:
        return  # no docker-py: this process built nothing on a local engine to hold
    owner = OwnerProcess.current()
    name = _volume_name(ref, owner)
    try:
        api = _client().api
        try:
            existing = api.inspect_volume(name)
        except docker.errors.NotFound:
            existing = None
        if existing is not None:
            if OwnerProcess.from_labels(existing.get("Labels") or {}) == owner:
                return
            api.remove_volume(name, force=True)
        api.create_volume(name=name, labels={HOLD_LABEL: ref, **owner.labels()})
        _live_holds(api, HOLD_LABEL)
    except docker.errors.DockerException as exc:  # best effort: the engine's own refusal remains
        log.warning("cannot record that this process uses image %s: %s", ref, exc)


def _live_holds(api: Any, label: str) -> list[OwnerProcess]:
    """The owners of the live holds matching the volume filter ``label``; dead ones are removed."""
    docker = docker_py()
    live = []
    for volume in api.volumes(filters={"label": label}).get("Volumes") or []:
        owner = OwnerProcess.from_labels(volume.get("Labels") or {})
        if owner is not None and not owner.is_dead():
            live.append(owner)
            continue
        try:
            api.remove_volume(volume["Name"], force=True)
        except docker.errors.APIError:
            pass  # another process dropped it first
    return live


def holders(ref: str, *, besides: OwnerProcess | None = None) -> list[OwnerProcess]:
    """The live processes holding ``ref`` (other than ``besides``); dead holds are dropped."""
    return [owner for owner in _live_holds(_client().api, f"{HOLD_LABEL}={ref}") if owner != besides]


def remove_unheld(ref: str) -> str | None:
    """Remove the image ``ref`` unless another live process holds it (or a container uses it);
    returns why it was kept, or None once it is gone."""
    docker = docker_py()
    me = OwnerProcess.current()
    others = holders(ref, besides=me)
    if others:
        return f"{ref}: in use by {', '.join(f'pid {o.pid} on {o.host}' for o in others)} (kept)"
    try:
        _client().images.remove(ref)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        return f"{ref}: {exc.explanation or exc}"
    try:
        _client().api.remove_volume(_volume_name(ref, me), force=True)
    except docker.errors.APIError:
        pass  # this process never held it, or it is gone already
    return None
