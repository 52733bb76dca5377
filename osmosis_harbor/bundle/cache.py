"""The content-addressed bundle cache.

A bundle lives at ``<cache>/<key[:16]>/<wheel filename>``. The key hashes every
input that can change the wheel's bytes, so an existing entry is returned without
building. Entries appear atomically: a builder works in a private temporary
directory inside the cache and renames it into place; when another builder got
there first, the rename fails and the loser discards its own result.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from osmosis_harbor import settings
from osmosis_harbor.bundle.project import CACHEDIR_SIGNATURE, CACHEDIR_TAG, Project
from osmosis_harbor.bundle.shim import Shim
from osmosis_harbor.bundle.targets import Targets
from osmosis_harbor.errors import BundleError

__all__ = [
    "ENV_CACHE_DIR",
    "FORMAT_VERSION",
    "cache_root",
    "compute_key",
    "entry_dir",
    "find_cached",
    "publish",
    "workspace",
]

FORMAT_VERSION = "osmosis-harbor-bundle/2"  # bump whenever the bundler changes what it writes
ENV_CACHE_DIR = "OSMOSIS_HARBOR_BUNDLES"
KEY_PREFIX_LEN = 16
STALE_SCRATCH_SEC = 6 * 3600  # scratch dirs of builders that died are removed after this
_CHUNK = 1 << 20


def cache_root(cache_dir: Path | None) -> Path:
    """``cache_dir``, else ``$OSMOSIS_HARBOR_BUNDLES``, else the user cache; made absolute. The
    settings are read here only for a caller of the public ``build_bundle`` that names no cache
    (an entry point: the backend and the ``bundle`` command pass the one their settings give)."""
    chosen = cache_dir if cache_dir is not None else settings.current().bundle_cache()
    return Path(os.path.abspath(Path(chosen).expanduser()))


def compute_key(project: Project, targets: Targets, shim: Shim) -> str:
    """sha256 over the bundler format, the selected targets, the shim and every project file."""
    h = hashlib.sha256()

    def field(name: str, value: bytes) -> None:
        h.update(name.encode() + b"\0" + len(value).to_bytes(8, "big") + value)

    field("format", FORMAT_VERSION.encode())
    field("package", project.package.encode())
    for kind in ("workflow", "workflow_config", "grader", "grader_config"):
        field(f"target:{kind}", (getattr(targets, kind) or "").encode())
    field("shim:version", shim.version.encode())
    for name in sorted(shim.files):
        field(f"shim:{name}", shim.files[name])
    for rel in project.files:  # pyproject.toml is one of them
        field(f"src:{rel}", _file_digest(project.root / rel))
    return h.hexdigest()


def _file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.digest()


def entry_dir(root: Path, key: str) -> Path:
    return root / key[:KEY_PREFIX_LEN]


def find_cached(root: Path, key: str) -> Path | None:
    """The cached wheel for *key*, or ``None``. Entries are complete or absent."""
    entry = entry_dir(root, key)
    try:
        wheels = sorted(p for p in entry.iterdir() if p.name.endswith(".whl"))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        wheels = []
    if len(wheels) != 1:
        raise BundleError(f"the bundle cache entry {entry} is damaged ({len(wheels)} wheels); delete it and retry")
    return wheels[0]


@contextmanager
def workspace(root: Path, key: str) -> Iterator[Path]:
    """A private scratch directory inside the cache (same filesystem, so renames are atomic)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tag_cache_dir(root)
        _remove_stale_scratch(root)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:KEY_PREFIX_LEN]}-", dir=root))
    except OSError as exc:
        raise BundleError(f"cannot write to the bundle cache {root} ({exc}); pass a writable cache_dir") from None
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tag_cache_dir(root: Path) -> None:
    """Mark *root* with a CACHEDIR.TAG (bford.info/cachedir): project walks and backups skip it."""
    tag = root / CACHEDIR_TAG
    if not tag.exists():
        fd, tmp = tempfile.mkstemp(prefix=f".{CACHEDIR_TAG}.", dir=root)
        with os.fdopen(fd, "wb") as fh:
            fh.write(CACHEDIR_SIGNATURE + b"\n# A cache of Osmosis bundle wheels made by osmosis-harbor.\n")
        os.replace(tmp, tag)


def _remove_stale_scratch(root: Path) -> None:
    cutoff = time.time() - STALE_SCRATCH_SEC
    for path in root.glob(".tmp-*"):
        try:
            if path.stat().st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def publish(staged: Path, root: Path, key: str) -> Path:
    """Move the directory *staged* (holding one wheel) to the entry for *key*; return the wheel.

    When another builder published the same key first, its entry wins.
    """
    entry = entry_dir(root, key)
    try:
        os.rename(staged, entry)  # fails on an existing non-empty directory
    except OSError:
        cached = find_cached(root, key)
        if cached is None:
            raise
        return cached
    (wheel,) = entry.glob("*.whl")
    return wheel
