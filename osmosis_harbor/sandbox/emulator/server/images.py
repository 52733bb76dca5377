"""Images on the emulator's side: pulled by registry reference only, snapshots pushed back.

SkyPilot pods start from an image reference their node pulls; nothing built on the caller's
machine is visible to them unless it was pushed. The emulator runs on the very engine that
builds task images, so it must not take the shortcut a local tag offers: every create pulls
the reference from its registry first (a tag that was built but never pushed fails the pull,
like ErrImagePull), and only registries on this machine are tried (this machine's network
rule; a public reference would be an image pull SkyPilot's nodes do and we cannot).
"""

from __future__ import annotations

import ipaddress
import time

import docker.errors

from osmosis_harbor.sandbox.docker import get_engine
from osmosis_harbor.sandbox.emulator.errors import ImagePullError, InvalidRequestError

__all__ = ["DEFAULT_REGISTRY", "pull", "registry_host", "snapshot"]

DEFAULT_REGISTRY = "127.0.0.1:5000"


def registry_host(image: str) -> str | None:
    """The registry part of an image reference (``host[:port]``), or None for a bare name."""
    first, sep, _ = image.partition("/")
    if not sep or not ("." in first or ":" in first or first == "localhost"):
        return None
    return first


def _is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def pull(image: str) -> str:
    """Pull ``image`` from its registry (every time: a local tag alone never counts).

    Returns the pulled image id; raises `ImagePullError` shaped like SkyPilot's ErrImagePull."""
    host = registry_host(image)
    if host is None:
        raise ImagePullError(
            f"ErrImagePull: image {image!r} is not a registry reference; push it to a registry "
            f"(e.g. {DEFAULT_REGISTRY}/{image}) and pass that reference"
        )
    if not _is_loopback(host):
        raise ImagePullError(
            f"ErrImagePull: image {image!r}: the emulator pulls only from registries on this machine "
            f"(e.g. {DEFAULT_REGISTRY}), not from {host}"
        )
    repository, tag = _split(image)
    api = get_engine().api
    try:
        api.pull(repository, tag=tag)
        return str(api.inspect_image(image)["Id"])
    except docker.errors.APIError as exc:
        raise ImagePullError(f"ErrImagePull: cannot pull {image!r} from {host}: {exc.explanation or exc}") from exc


def _split(image: str) -> tuple[str, str]:
    """(repository, tag) of a reference; a digest reference keeps its digest as the tag."""
    if "@" in image:
        repository, digest = image.split("@", 1)
        return repository, digest
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = image.rsplit(":", 1)
        return repository, tag
    return image, "latest"


def snapshot(container_id: str, sandbox: str, registry: str) -> str:
    """Commit the sandbox's filesystem and push it as ``{registry}/snapshots:{sandbox}-{time}``."""
    if not registry:
        raise InvalidRequestError("snapshot needs a registry: start the emulator with --registry")
    engine = get_engine()
    repository = f"{registry.rstrip('/')}/snapshots"
    tag = f"{sandbox}-{int(time.time() * 1000)}"
    try:
        engine.api.commit(container_id, repository=repository, tag=tag)
        for line in engine.api.push(repository, tag=tag, stream=True, decode=True):
            if isinstance(line, dict) and line.get("error"):
                raise ImagePullError(f"snapshot push of {repository}:{tag} failed: {line['error']}")
    except docker.errors.APIError as exc:
        raise ImagePullError(f"snapshot of {sandbox!r} failed: {exc.explanation or exc}") from exc
    return f"{repository}:{tag}"
