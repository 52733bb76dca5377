"""What the Docker SDK takes from the settings, as one frozen value.

The SDK reads the settings in one place, where a call enters it (``engine.get_engine``), as each
call of SkyPilot's SDK reads its own configuration; everything below (the engine's creates, the
pool locks, the layer bound, a command's output, file reads) is handed this value instead of
reading the settings again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from osmosis_harbor.sandbox.sdk.privileges import SandboxPrivileges
from osmosis_harbor.sandbox.transfer.extract.limits import TransferLimits
from osmosis_harbor.settings import Settings

__all__ = ["DockerConfig"]


@dataclass(frozen=True)
class DockerConfig:
    """The Docker SDK's settings (named as in ``Settings``, whose fields say what each is)."""

    docker_host: str
    lock_dir: Path  # the pool locks' directory (``locks.py``)
    image_tmp_dir: Path  # the images' /tmp seeds, by image id (``tmp_seeds.py``)
    sandbox_disk_mb: int
    sandbox_inodes: int
    sandbox_no_new_privileges: bool
    sandbox_seccomp_profile: Path | None
    exec_output_max_bytes: int
    docker_sdk_threads: int  # the calls' pool's size, and so the client's connections
    transfers: TransferLimits  # a file read's and an archive's bounds (``files.py``)
    lean_engine_client: bool  # the engine's requests over http.client (``lean_http.py``)

    @classmethod
    def of(cls, current: Settings) -> DockerConfig:
        return cls(
            docker_host=current.docker_host,
            lock_dir=current.pool_lock_dir(),
            image_tmp_dir=current.image_tmp_dir(),
            sandbox_disk_mb=current.sandbox_disk_mb,
            sandbox_inodes=current.sandbox_inodes,
            sandbox_no_new_privileges=current.sandbox_no_new_privileges,
            sandbox_seccomp_profile=current.sandbox_seccomp_profile,
            exec_output_max_bytes=current.exec_output_max_bytes,
            docker_sdk_threads=current.docker_sdk_threads,
            transfers=TransferLimits.of(current),
            lean_engine_client=current.lean_engine_client,
        )

    def privileges(self) -> SandboxPrivileges:
        """A create's privileges: the profile file is read then, so a bad one fails the create
        (naming the setting), not every call of the SDK."""
        return SandboxPrivileges.of(self)
