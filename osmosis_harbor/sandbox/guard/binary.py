"""The guard program, built from its C source with the host's compiler and kept in the user cache.

Why built here rather than shipped: a prebuilt binary in the wheel is bytes nobody reviews; the
source is in the package and the build is one ``cc`` call (no libc, so any C compiler for the
target works, ``clang --target=...`` for another architecture). The cache is keyed by the source's
hash, so a changed source is a new binary and concurrent builders each rename a finished file into
place (the last one wins, all equal).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform as host_platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from osmosis_harbor import settings
from osmosis_harbor.errors import VerifierGuardError

__all__ = ["GuardBinary", "guard_binary", "target_arch"]

SOURCE = Path(__file__).with_name("guard.c")  # one translation unit: it includes the *.h beside it
# The sandbox platforms Harbor builds for (``--platform``), and the guard's name for each.
_ARCHES = {"linux/amd64": "x86_64", "linux/x86_64": "x86_64", "linux/arm64": "aarch64", "linux/aarch64": "aarch64"}
_HOST_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
FLAGS = (
    "-static",
    "-nostdlib",
    "-ffreestanding",
    "-fno-stack-protector",
    "-fno-pic",
    "-no-pie",
    "-fno-asynchronous-unwind-tables",
    "-Os",
    "-Wl,--gc-sections",
    "-s",
)


@dataclass(frozen=True)
class GuardBinary:
    """A built guard: where it is on the host, its bytes' hash, the architecture it runs on."""

    path: Path
    sha256: str
    arch: str

    def read(self) -> bytes:
        return self.path.read_bytes()


def target_arch(platform: str | None) -> str:
    """The guard's architecture for a sandbox platform (``linux/amd64`` by default, as Harbor's)."""
    name = (platform or "linux/amd64").lower()
    arch = _ARCHES.get(name)
    if arch is None:
        raise VerifierGuardError(
            f"the verifier guard runs on linux/amd64 and linux/arm64 sandboxes, not {platform!r}: "
            "set OSMOSIS_HARBOR_VERIFIER_GUARD=0 to run dataset verifiers unguarded"
        )
    return arch


def _compilers(arch: str) -> list[list[str]]:
    """Compiler commands that build for ``arch``, best first: the host's own ``cc`` when it
    is that architecture, then clang cross-compiling (no libc needed)."""
    found: list[list[str]] = []
    native = _HOST_ARCHES.get(host_platform.machine().lower()) == arch
    if native:
        found += [[cc] for cc in ("cc", "gcc", "clang") if shutil.which(cc)]
    if shutil.which("clang"):
        found.append(["clang", f"--target={arch}-linux-gnu", "-fuse-ld=lld"] if not native else ["clang"])
    if shutil.which(f"{arch}-linux-gnu-gcc"):
        found.append([f"{arch}-linux-gnu-gcc"])
    return found


def _cache_dir(config: settings.Settings) -> Path:
    return config.user_cache() / "guard"


@functools.lru_cache(maxsize=8)
def _built(source_sha: str, arch: str, cache: Path) -> GuardBinary:
    target = cache / f"{source_sha[:16]}-{arch}" / "osmosis-guard"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        _compile(arch, target)
    data = target.read_bytes()
    return GuardBinary(target, hashlib.sha256(data).hexdigest(), arch)


def _compile(arch: str, target: Path) -> None:
    compilers = _compilers(arch)
    if not compilers:
        raise VerifierGuardError(
            f"building the verifier guard for {arch} needs a C compiler: install gcc (Debian: apt-get install "
            "gcc) or clang, or set OSMOSIS_HARBOR_VERIFIER_GUARD=0 to run dataset verifiers unguarded"
        )
    errors = []
    for cc in compilers:
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            out = Path(scratch) / "osmosis-guard"
            done = subprocess.run([*cc, *FLAGS, "-o", str(out), str(SOURCE)], capture_output=True, text=True)
            if done.returncode == 0 and out.is_file():
                out.chmod(0o755)
                os.replace(out, target)
                return
            errors.append(f"{' '.join(cc)}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    raise VerifierGuardError(f"building the verifier guard for {arch} failed: {'; '.join(errors)}")


def source_hash() -> str:
    """The hash of the guard's sources (``guard.c`` and the parts it includes)."""
    digest = hashlib.sha256()
    for path in sorted([SOURCE, *SOURCE.parent.glob("*.h")]):
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def guard_binary(platform: str | None = None, *, config: settings.Settings) -> GuardBinary:
    """The guard for sandboxes of ``platform``, built on first use (then a cached file under
    ``config``'s cache dir: the caller's settings, the plan's or the environment's)."""
    return _built(source_hash(), target_arch(platform), _cache_dir(config))
