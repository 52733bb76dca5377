"""The images' own /tmp content, which a sandbox's tmpfs would hide: read once per image id.

Reading it takes a probe container (``tmp_volume.read_image_tmp``, about 0.2 CPU-s of the
engine's work), so it is read once per image at a time in a process, and kept on disk for the
next process: an image id is the digest of the image's content, so what its /tmp holds never
changes. Every CLI run, validate run and backend start on the same images would otherwise probe
each again.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from pathlib import Path

from docker import APIClient

from osmosis_harbor.sandbox.docker.tmp_volume import read_image_tmp

__all__ = ["MAX_STORED_BYTES", "ImageTmpSeeds"]

log = logging.getLogger(__name__)

# A seed above this stays in the process's memory only: the cache must not fill the user's disk
# with the /tmp of a hostile image (the sandbox's tmpfs bounds what a seed can usefully be).
MAX_STORED_BYTES = 8 * 1024 * 1024
_IMAGE_ID = re.compile(r"sha256:([0-9a-f]{64})")


class ImageTmpSeeds:
    """Image id -> its /tmp as a tar (None: empty), from memory, the disk store, or a probe."""

    def __init__(self, api: APIClient, store: Path) -> None:
        self._api = api
        self._store = store
        self._known: dict[str, bytes | None] = {}
        self._probes: dict[str, threading.Lock] = {}  # image id -> held while its /tmp is read
        self._lock = threading.Lock()

    def seed(self, image_id: str) -> bytes | None:
        with self._lock:
            if image_id in self._known:
                return self._known[image_id]
            probing = self._probes.setdefault(image_id, threading.Lock())
        # One probe per image at a time: the creates of a burst on a new image (a batch's first
        # trials) wait for its answer instead of each making a container of their own.
        with probing:
            with self._lock:
                if image_id in self._known:
                    return self._known[image_id]
            found, seed = self._load(image_id)
            if not found:
                seed = read_image_tmp(self._api, image_id)
                self._save(image_id, seed)
            with self._lock:
                self._known[image_id] = seed
                self._probes.pop(image_id, None)
        return seed

    def _path(self, image_id: str) -> Path | None:
        match = _IMAGE_ID.fullmatch(image_id)
        return self._store / match.group(1) if match else None

    def _load(self, image_id: str) -> tuple[bool, bytes | None]:
        """(found, seed); an empty file is an image whose /tmp is empty (a tar never is)."""
        path = self._path(image_id)
        if path is None:
            return False, None
        try:
            data = path.read_bytes()
        except OSError:
            return False, None
        return True, data or None

    def _save(self, image_id: str, seed: bytes | None) -> None:
        path = self._path(image_id)
        if path is None or (seed is not None and len(seed) > MAX_STORED_BYTES):
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written aside and renamed: a reader in another process sees the whole seed or none.
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".seed-")
        except OSError as exc:  # a read-only cache costs a probe per process, nothing more
            log.debug("image /tmp seed of %s not stored: %s", image_id, exc)
            return
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(seed or b"")
            os.replace(temp, path)
        except OSError as exc:
            log.debug("image /tmp seed of %s not stored: %s", image_id, exc)
            Path(temp).unlink(missing_ok=True)
