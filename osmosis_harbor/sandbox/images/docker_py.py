"""The Docker SDK for Python (docker-py), found only when an image is built or asked after.

docker-py comes with ``osmosis-harbor[docker]``: a SkyPilot user whose task images are already in
a registry never needs it, so nothing imports it until a local engine is really asked.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from osmosis_harbor.errors import DockerSdkMissingError


def docker_py() -> ModuleType:
    """The ``docker`` module (with ``docker.errors`` loaded), or a clear error naming the extra."""
    try:
        module = importlib.import_module("docker")
        importlib.import_module("docker.errors")
    except ImportError as exc:
        raise DockerSdkMissingError(exc) from exc
    return module
