"""`SandboxSdkMissingError` as Harbor's ``MissingExtraError`` too, where it is raised.

Code written for Harbor catches ``MissingExtraError`` around an environment whose SDK is not
installed; ours is caught there as well. The class lives here, not in ``errors.py``, because
``import osmosis_harbor`` imports nothing of Harbor.
"""

from __future__ import annotations

from harbor.utils.optional_import import MissingExtraError

from osmosis_harbor.errors import SandboxSdkMissingError

__all__ = ["HarborSandboxSdkMissingError"]


class HarborSandboxSdkMissingError(SandboxSdkMissingError, MissingExtraError):
    """What the SDK registry raises for an SDK that cannot be imported."""
