"""Sandboxes for Harbor trials: SkyPilot in production, a local Docker engine here.

``environment_config()`` is the one documented way to point Harbor trials (and
``HarborBackend``) at our sandbox environment.
"""

from __future__ import annotations

from typing import Any, Literal

from harbor.models.trial.config import EnvironmentConfig

from osmosis_harbor.errors import ConfigError, SandboxSdkMissingError
from osmosis_harbor.sandbox.environment import IMPORT_PATH, SandboxEnvironment
from osmosis_harbor.sandbox.registry import (
    DEFAULT_SDK,
    SDK_NAMES,
    implementation,
    load_sandbox_sdk,
)

__all__ = [
    "SandboxEnvironment",
    "SDK_NAMES",
    "SandboxSdkMissingError",
    "environment_config",
    "load_sandbox_sdk",
]


def environment_config(
    sdk: str = DEFAULT_SDK,
    *,
    registry: str | None = None,
    pool: str | None = None,
    context_name: str | None = None,
    namespace: str | None = None,
    secrets: list[str] | None = None,
    host_network: bool = False,
    pool_size: int | Literal["auto"] | None = None,
    force_build: bool = False,
    delete: bool = True,
    **extra_kwargs: Any,
) -> EnvironmentConfig:
    """Return the Harbor ``EnvironmentConfig`` that runs trials in our sandboxes.

    ``sdk="skypilot"`` uses SkyPilot's Platform Sandbox SDK (``sky.sandbox``);
    ``sdk="docker"`` uses the local Docker engine. ``host_network`` is Docker-only and an
    explicit opt-in: the sandbox shares the host's whole network, every loopback service
    included. Without it, a rollout's chat endpoint on this machine's loopback reaches local
    sandboxes through the backend's policy relay (``relay.py``), and nothing else does. ``pool`` names
    the warm pool trials claim sandboxes from (``HarborBackend.prewarm`` creates one pool
    per environment group, named after it, with ``pool_size`` running sandboxes, or sized
    from the observed claim rate with ``pool_size="auto"``).
    """
    impl = implementation(sdk)
    if host_network and not impl.reaches_host:
        reachers = [name for name in SDK_NAMES if implementation(name).reaches_host]
        raise ConfigError(f"host_network=True is only available with sdk={' or '.join(map(repr, reachers))}")
    impl.load()  # fail now, with the install hint, not mid-trial
    kwargs: dict[str, Any] = {"sdk": sdk, **extra_kwargs}
    for key, value in {
        "registry": registry,
        "pool": pool,
        "context_name": context_name,
        "namespace": namespace,
        "secrets": list(secrets) if secrets else None,
    }.items():
        if value is not None:
            kwargs[key] = value
    if host_network:
        kwargs["host_network"] = True
    if pool_size is not None:
        if pool is None:
            raise ConfigError("pool_size needs pool= (the warm pool's base name)")
        if pool_size != "auto" and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0):
            raise ConfigError(f"pool_size must be an integer >= 0 or 'auto', got {pool_size!r}")
        kwargs["pool_size"] = pool_size
    return EnvironmentConfig(import_path=IMPORT_PATH, kwargs=kwargs, force_build=force_build, delete=delete)
