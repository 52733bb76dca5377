"""osmosis-harbor: Osmosis rollouts as Harbor trials in SkyPilot (or local Docker) sandboxes.

The public API is ``__all__``. Heavy names (the backend, the sandbox environment, validation)
are imported on first use (PEP 562), so ``import osmosis_harbor`` imports neither Harbor, nor
the Docker SDK, nor osmosis_ai's rollout package (the errors name their categories by value), and
has no side effects.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from osmosis_harbor.errors import (
    BundleError,
    ConfigError,
    DatasetError,
    OsmosisHarborError,
    PrewarmError,
    SandboxLostError,
    SandboxSdkMissingError,
    TaskResolutionError,
)

if TYPE_CHECKING:
    from osmosis_harbor.backend import HarborBackend
    from osmosis_harbor.bundle import BundleInfo, build_bundle, inspect_bundle
    from osmosis_harbor.prewarm import PrewarmReport
    from osmosis_harbor.sandbox import environment_config
    from osmosis_harbor.serving.server import add_status_route, serve
    from osmosis_harbor.testing import FakeChatServer
    from osmosis_harbor.validate import ValidationReport, validate_tasks

__all__ = [
    "BundleError",
    "BundleInfo",
    "ConfigError",
    "DatasetError",
    "FakeChatServer",
    "HarborBackend",
    "OsmosisHarborError",
    "PrewarmError",
    "PrewarmReport",
    "SandboxLostError",
    "SandboxSdkMissingError",
    "TaskResolutionError",
    "ValidationReport",
    "add_status_route",
    "build_bundle",
    "environment_config",
    "inspect_bundle",
    "serve",
    "validate_tasks",
]

_LAZY = {
    "HarborBackend": "osmosis_harbor.backend",
    "BundleInfo": "osmosis_harbor.bundle",
    "build_bundle": "osmosis_harbor.bundle",
    "inspect_bundle": "osmosis_harbor.bundle",
    "PrewarmReport": "osmosis_harbor.prewarm",
    "environment_config": "osmosis_harbor.sandbox",
    "add_status_route": "osmosis_harbor.serving.server",
    "serve": "osmosis_harbor.serving.server",
    "FakeChatServer": "osmosis_harbor.testing",
    "ValidationReport": "osmosis_harbor.validate",
    "validate_tasks": "osmosis_harbor.validate",
}


def __getattr__(name: str) -> Any:
    """``from osmosis_harbor import HarborBackend`` imports Harbor only then."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'osmosis_harbor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
