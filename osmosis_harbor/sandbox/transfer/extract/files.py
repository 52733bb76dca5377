"""Single files from a sandbox onto the host, and bounded copies of byte streams.

A downloaded file lands at a host path that an earlier extraction may have filled (a link
left at that name, say): it is written like an archive member, as a new file created
``O_EXCL | O_NOFOLLOW`` in its directory's fd, so nothing there is ever followed.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from osmosis_harbor.errors import TransferLimitError
from osmosis_harbor.sandbox.transfer.extract.beneath import Beneath

__all__ = ["copy_into", "write_file"]


def write_file(target: Path, data: bytes | BinaryIO, size: int | None = None, *, mode: int = 0o644) -> None:
    """Write ``data`` (bytes, or ``size`` bytes of a stream) as a new file at host path ``target``."""
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    length = len(data) if isinstance(data, bytes) else size
    if length is None:
        raise ValueError("a stream needs its size")
    with Beneath(target.parent) as tree:
        tree.write_file((target.name,), source, length, mode, None)


def copy_into(chunks: Iterable[bytes], into: BinaryIO, *, limit: int, transfer: str, setting: str) -> int:
    """Write ``chunks`` to ``into``, refusing (before writing it) the chunk that would pass
    ``limit`` bytes; returns the bytes written. What is never held: more than one chunk."""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise TransferLimitError(transfer, "the archive (bytes, at least)", total, limit, setting)
        into.write(chunk)
    return total
