"""The bounds of one transfer out of a sandbox, made once from the owner's ``Settings`` and carried as data."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from osmosis_harbor.errors import TransferLimitError
from osmosis_harbor.settings import Settings

__all__ = ["ARCHIVE_OVERHEAD_PER_ENTRY", "TransferLimits", "masked"]

# What a tar may carry per entry besides file content: its header, a PAX header with long
# names, and the padding of both. Bounds the archive bytes received for a transfer.
ARCHIVE_OVERHEAD_PER_ENTRY = 4096


# A run of token characters this long in a sandbox-made name could be a secret the workflow
# was given (the rollout's API key): names go into logs and errors with such runs masked.
_TOKEN = re.compile(r"[A-Za-z0-9_\-+=]{24,}")


def masked(text: str, limit: int = 200) -> str:
    """Sandbox-made text (a name, a link target) as logs and errors may show it: long token
    runs masked, at most ``limit`` characters."""
    text = _TOKEN.sub(lambda m: m.group()[:4] + "…", text)
    return text if len(text) <= limit else text[:limit] + "…"


class TransferLimits(BaseModel):
    """How much one transfer may bring to the host; exceeding any raises `TransferLimitError`."""

    model_config = ConfigDict(frozen=True)

    max_bytes: int
    max_file_bytes: int
    max_files: int
    max_depth: int
    max_path_bytes: int

    @classmethod
    def of(cls, s: Settings) -> TransferLimits:
        """The bounds ``s`` (the owner's one reading of the settings) gives."""
        return cls(
            max_bytes=s.transfer_max_bytes,
            max_file_bytes=s.transfer_max_file_bytes,
            max_files=s.transfer_max_files,
            max_depth=s.transfer_max_depth,
            max_path_bytes=s.transfer_max_path_bytes,
        )

    @property
    def max_archive_bytes(self) -> int:
        """Archive bytes one transfer may receive: the content bound plus each entry's headers."""
        return self.max_bytes + self.max_files * ARCHIVE_OVERHEAD_PER_ENTRY

    def check_archive(self, transfer: str, received: int) -> None:
        if received > self.max_archive_bytes:
            raise TransferLimitError(
                transfer, "the archive (bytes)", received, self.max_archive_bytes, "transfer_max_bytes"
            )

    def check_file(self, transfer: str, name: str, size: int) -> None:
        if size > self.max_file_bytes:
            raise TransferLimitError(
                transfer, f"file {masked(name)!r} (bytes)", size, self.max_file_bytes, "transfer_max_file_bytes"
            )
