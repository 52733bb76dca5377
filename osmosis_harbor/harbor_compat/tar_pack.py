"""Whether a sandbox-side ``tar`` pack of Harbor's succeeded, as the installed Harbor judges it.

Harbor 0.26 accepts GNU tar's exit 1 when its only words are "file changed as we read it" (a
log file still being written), logging a warning; 0.25 takes any non-zero exit as a failure.
Where we run Harbor's own pack commands (``sandbox/transfer/filtered.py``) we judge as it does.
"""

from __future__ import annotations

import importlib
from logging import Logger
from typing import Any

from osmosis_harbor.harbor_compat.version import HARBOR

__all__ = ["pack_succeeded"]


def pack_succeeded(return_code: int | None, *, stdout: str | None, stderr: str | None, logger: Logger) -> bool:
    if not HARBOR.tar_pack_tolerant:
        return return_code == 0
    transfer: Any = importlib.import_module("harbor.environments.tar_transfer")  # its check is 0.26's (surface.py)
    return bool(transfer.tar_pack_succeeded(return_code, stdout=stdout, stderr=stderr, logger=logger))
