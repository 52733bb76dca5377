"""A command's output as the host keeps it: the last bytes of each stream, and a count of the rest.

Everything a sandbox prints is the policy's to choose, and 512 MB of stdout must not become
512 MB of host memory. Each stream keeps its last ``Settings.exec_output_max_bytes`` (the
end of a log is where the error is); what came before is counted, and the text a caller
reads starts with a line saying how much was dropped.
"""

from __future__ import annotations

__all__ = ["OutputTail"]


class OutputTail:
    """The last ``limit`` bytes of a stream. Trimmed when twice that is held, so appending
    stays linear and the memory held is at most ``2 * limit``."""

    def __init__(self, name: str, limit: int) -> None:
        self._name = name
        self._limit = limit
        self._buffer = bytearray()
        self._dropped = 0

    def append(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > 2 * self._limit:
            self._trim()

    def _trim(self) -> None:
        cut = len(self._buffer) - self._limit
        if cut > 0:
            del self._buffer[:cut]
            self._dropped += cut

    @property
    def dropped(self) -> int:
        """Bytes of the stream that are not kept."""
        return self._dropped + max(0, len(self._buffer) - self._limit)

    def value(self) -> bytes:
        """What is kept, after a note of what was dropped (when anything was)."""
        self._trim()
        if not self._dropped:
            return bytes(self._buffer)
        note = f"[osmosis-harbor: the first {self._dropped} bytes of {self._name} were dropped; the last {self._limit} follow]\n"
        return note.encode() + bytes(self._buffer)
