"""A sandbox's /tmp: a bounded tmpfs volume, seeded with what the image itself holds there."""

from __future__ import annotations

import io
import tarfile
import uuid

import docker
import docker.errors
import docker.types
from docker import APIClient

from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.sdk.bounds import TMP_PATH, SandboxBounds

__all__ = ["read_image_tmp", "tmp_mount"]


def tmp_mount(bounds: SandboxBounds) -> docker.types.Mount:
    """An anonymous tmpfs *volume* (not HostConfig.Tmpfs): the engine's archive API, which
    ``write_bytes`` / ``read_bytes`` use, reaches into volumes but not into tmpfs mounts."""
    return docker.types.Mount(
        target=TMP_PATH,
        source=None,
        type="volume",
        labels={L.MANAGED: "1", L.TMP_VOLUME: "1"},  # reaped once dangling (reap.remove_dangling_tmp_volumes)
        driver_config=docker.types.DriverConfig(
            "local", {"type": "tmpfs", "device": "tmpfs", "o": f"size={bounds.tmp_mb}m,mode=1777"}
        ),
    )


def _has_children(archive: bytes) -> bool:
    """Whether a directory's tar holds anything besides the directory itself."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return any("/" in member.name.strip("/") for member in tar)


def read_image_tmp(api: APIClient, image_id: str) -> bytes | None:
    """The image's own /tmp content as a tar (None: empty or absent), which the tmpfs mounted
    there would hide: read from a never-started probe container, since before start the archive
    API sees the image's files, afterwards only the empty tmpfs."""
    probe = api.create_container(
        image_id,
        command=["true"],
        name=f"ohseed_{uuid.uuid4().hex[:12]}",
        host_config=api.create_host_config(network_mode="none"),
    )["Id"]
    try:
        stream, _ = api.get_archive(probe, TMP_PATH)
        archive: bytes | None = b"".join(stream)
    except docker.errors.NotFound:  # the image has no /tmp at all
        archive = None
    finally:
        api.remove_container(probe, force=True, v=True)
    return archive if archive is not None and _has_children(archive) else None
