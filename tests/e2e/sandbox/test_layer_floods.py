"""Floods of the writable layer that its byte count alone does not stop.

* Files by the hundred thousand: empty, so they take the host filesystem's inodes and next to no
  blocks. The sandbox is evicted at its inode bound (``OSMOSIS_HARBOR_SANDBOX_INODES``, small
  here), the flooder's rollout is its own ``agent_error`` naming the bound and the setting, a
  victim beside it succeeds, and the host's free inodes never fall by anything like the flood.
  Positive control: with the bound off, the same files land and the rollout succeeds.
* One preallocation far past the disk bound (``fallocate``, ``posix_fallocate``): refused in the
  sandbox (EFBIG: every process runs under a file size limit at the disk bound), so the host's
  free space never falls by more than the bound and a margin. Positive control: with the bound
  off, the allocation takes its blocks.
* The preallocation that limit cannot see (``fallocate --keep-size``): refused under a seccomp
  profile made by ``seccomp-profile`` (``OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE``), with io_uring,
  while growing a file still works and the base profile's own refusals stay. Positive control:
  under the engine's default profile it takes its blocks. (The base is the test's own, permissive
  but for one refusal: Docker does not expose its default profile.)

On the Docker path only. The bounds, the file size limit and the seccomp profile are set on the
container by the Docker implementation, which the emulator's server runs for its sandboxes too
(reading the same settings), and the disk watch that evicts is that implementation's. What the
emulator's path adds, an eviction reported as SkyPilot reports it and read back by the host, is
``backend/test_resource_floods.py``'s on both paths (a disk flood's eviction, ``ls`` listing it).
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.sandbox import load_sandbox_sdk
from osmosis_harbor.sandbox.sdk.seccomp import restrict_preallocation
from tests.support.floods import IMAGE, MIB, FreeSpace, assert_victim_fine, flood_beside_victim, make_backend
from tests.support.sdk_paths import SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

DISK_MB = 256
INODES = 20_000  # above the ~6,000 files a pip-installed bundle leaves in the layer
BOUNDED = {"OSMOSIS_HARBOR_SANDBOX_DISK_MB": str(DISK_MB), "OSMOSIS_HARBOR_SANDBOX_INODES": str(INODES)}
UNBOUNDED = {"OSMOSIS_HARBOR_SANDBOX_DISK_MB": "0", "OSMOSIS_HARBOR_SANDBOX_INODES": "0"}


@pytest.fixture(scope="module")
def seccomp_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base that allows all but ``keyctl``, as restricted by ``seccomp-profile``."""
    base = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": ["fallocate", "io_uring_setup", "io_uring_enter"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["keyctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
        ],
    }
    path = tmp_path_factory.mktemp("seccomp") / "restricted.json"
    path.write_text(json.dumps(restrict_preallocation(base)))
    return path


def _docker_path(monkeypatch: pytest.MonkeyPatch, settings: dict[str, str]) -> SdkPath:
    """The Docker path, this process (which creates its sandboxes) set with ``settings``."""
    monkeypatch.delenv("OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE", raising=False)
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    return SdkPath("docker")


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch) -> SdkPath:
    """Sandboxes made with the small bounds."""
    return _docker_path(monkeypatch, BOUNDED)


@pytest.fixture
def restricted(monkeypatch: pytest.MonkeyPatch, seccomp_profile: Path) -> SdkPath:
    """Sandboxes bounded and under the restricted seccomp profile."""
    return _docker_path(monkeypatch, {**BOUNDED, "OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE": str(seccomp_profile)})


@pytest.fixture
def unbounded(monkeypatch: pytest.MonkeyPatch) -> SdkPath:
    """Sandboxes made with the layer's bounds off (the controls)."""
    return _docker_path(monkeypatch, UNBOUNDED)


def files_flood(count: int) -> str:
    """``count`` empty files in one directory of the layer, then how many there are."""
    return f"mkdir /workspace/d && cd /workspace/d && seq {count} | xargs touch && ls -U | wc -l"


async def test_a_flood_of_empty_files_is_evicted_at_the_inode_bound_and_the_victim_succeeds(
    bounded: SdkPath, tmp_path, bundles_dir, fake_chat
) -> None:
    with FreeSpace() as space:
        flooder, victim = await flood_beside_victim(
            make_backend(tmp_path, bundles_dir, bounded), fake_chat, files_flood(200_000)
        )
    assert_victim_fine(victim)
    assert flooder.status is RolloutStatus.FAILURE
    assert flooder.err_category is RolloutErrorCategory.AGENT_ERROR, flooder.err_message
    assert f'inode limit "{INODES}"' in flooder.err_message, flooder.err_message
    assert "OSMOSIS_HARBOR_SANDBOX_INODES" in flooder.err_message and "lost" not in flooder.err_message
    # The bound, what one tick and walk let through, both bundles' files and this machine's other
    # users: far from the flood's 200,000.
    assert space.dipped_inodes < 100_000, f"free inodes fell by {space.dipped_inodes}"


async def test_positive_control_without_the_inode_bound_the_files_land(
    unbounded: SdkPath, tmp_path, bundles_dir, fake_chat
) -> None:
    flooder, victim = await flood_beside_victim(
        make_backend(tmp_path, bundles_dir, unbounded), fake_chat, files_flood(2 * INODES)
    )
    assert_victim_fine(victim)
    assert flooder.status is RolloutStatus.SUCCESS, flooder.err_message
    assert int(flooder.sample.messages[-1]["content"]) == 2 * INODES


# One allocation of 16 GiB by each of the two calls there are (the tool's fallocate(2), then
# glibc's posix_fallocate), each reporting how it ended and the blocks its file holds.
PREALLOCATE = (
    "fallocate -l 16G /fill1; echo fallocate=$? blocks=$(stat -c %b /fill1); "
    "python3 -c \"import os; fd = os.open('/fill2', os.O_CREAT | os.O_WRONLY)\n"
    "try:\n os.posix_fallocate(fd, 0, {size})\nexcept OSError as exc: print('posix_fallocate:', exc.strerror)\n"
    "else: print('posix_fallocate: done')\n"
    "print('blocks', os.stat('/fill2').st_blocks)\""
)


async def _preallocate(path: SdkPath, size: int, command: str = PREALLOCATE) -> str:
    sdk = load_sandbox_sdk(path.name)
    sandbox = await sdk.create.aio(name=f"prealloc-{uuid.uuid4().hex[:8]}", image=IMAGE, timeout=600)
    try:
        command = command.replace("16G", str(size)).replace("{size}", str(size))
        handle = await sandbox.exec.aio("sh", "-c", command, timeout_seconds=120)
        assert await handle.wait() == 0
        return str(handle.stdout.read())
    finally:
        await sandbox.terminate.aio(wait=True)


async def test_one_preallocation_past_the_disk_bound_is_refused_and_the_host_keeps_its_space(
    bounded: SdkPath,
) -> None:
    with FreeSpace() as space:
        out = await _preallocate(bounded, 16 * 1024 * MIB)
    assert "fallocate=153 blocks=0" in out, out  # killed by SIGXFSZ, nothing allocated
    assert "posix_fallocate: File too large" in out and "blocks 0" in out, out  # EFBIG
    # The bound and a margin for this machine's other users (another flood test's included): far
    # from the 16 GiB asked for.
    assert space.dipped < DISK_MB * MIB + 2048 * MIB, f"free space fell by {space.dipped / MIB:.0f} MiB"


async def test_positive_control_without_the_disk_bound_a_preallocation_takes_its_blocks(
    unbounded: SdkPath,
) -> None:
    size = 2 * DISK_MB * MIB
    out = await _preallocate(unbounded, size)
    assert "fallocate=0" in out and "posix_fallocate: done" in out, out
    blocks = [int(n) * 512 for n in re.findall(r"blocks[= ](\d+)", out)]
    assert len(blocks) == 2 and min(blocks) >= size, out


# Past the end of a file without growing it; growing another; io_uring; and the base's refusal.
KEEP_SIZE = (
    "touch /fill; fallocate --keep-size -l 16G /fill; echo keep=$? blocks=$(stat -c %b /fill); "
    "fallocate -l 1M /grown; echo grow=$?; "
    'python3 -c "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n'
    "for name, number in (('io_uring_setup', 425), ('keyctl', 250)):\n"
    ' print(name, libc.syscall(number, 1, 0), ctypes.get_errno())"'
)


async def test_a_restricted_seccomp_profile_refuses_the_preallocation_the_size_limit_cannot_see(
    restricted: SdkPath,
) -> None:
    with FreeSpace() as space:
        out = await _preallocate(restricted, 16 * 1024 * MIB, KEEP_SIZE)
    assert "keep=1 blocks=0" in out and "grow=0" in out, out  # "keep size mode is unsupported"
    assert "io_uring_setup -1 38" in out and "keyctl -1 1" in out, out  # ENOSYS; the base's EPERM
    assert space.dipped < DISK_MB * MIB + 2048 * MIB, f"free space fell by {space.dipped / MIB:.0f} MiB"


async def test_positive_control_under_the_engines_profile_keep_size_takes_its_blocks(unbounded: SdkPath) -> None:
    size = 2 * DISK_MB * MIB
    out = await _preallocate(unbounded, size, KEEP_SIZE)
    assert "keep=0" in out and "io_uring_setup -1 38" not in out, out
    blocks = int(re.search(r"blocks=(\d+)", out)[1]) * 512  # type: ignore[index]
    assert blocks >= size, out
