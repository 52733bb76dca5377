"""Sandboxes for Harbor trials: SkyPilot in production, a local Docker engine here.

``environment_config()`` is the one documented way to point Harbor trials (and
``HarborBackend``) at our sandbox environment. Harbor's models and the options model are imported
when it is called: every command imports this package (for ``SDK_NAMES``), and ``cleanup`` or
``--help`` need neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from osmosis_harbor.errors import SandboxSdkMissingError
from osmosis_harbor.sandbox.sdk.registry import DEFAULT_SDK, SDK_NAMES, load_sandbox_sdk

if TYPE_CHECKING:
    from harbor.models.trial.config import EnvironmentConfig

    from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment
    from osmosis_harbor.sandbox.options import SandboxOptions

__all__ = [
    "SandboxEnvironment",
    "SandboxOptions",
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
    sandboxes through the backend's policy relay (``relay/policy_relay.py``), and nothing else does. ``pool`` names
    the warm pool trials claim sandboxes from (``HarborBackend.prewarm`` creates one pool
    per environment group, named after it, with ``pool_size`` running sandboxes, or sized
    from the observed claim rate with ``pool_size="auto"``). ``extra_kwargs``: Harbor's own
    environment keywords; any other name is a `ConfigError` naming it (``options.py``).
    """
    from harbor.models.trial.config import EnvironmentConfig

    from osmosis_harbor.sandbox.options import IMPORT_PATH, SandboxOptions

    options = SandboxOptions.build(
        sdk=sdk,
        registry=registry,
        pool=pool,
        context_name=context_name,
        namespace=namespace,
        secrets=secrets,
        host_network=host_network,
        pool_size=pool_size,
        **extra_kwargs,
    )
    options.impl.load()  # fail now, with the install hint, not mid-trial
    return EnvironmentConfig(
        import_path=IMPORT_PATH, kwargs=options.to_kwargs(), force_build=force_build, delete=delete
    )


def __getattr__(name: str) -> Any:
    """``SandboxEnvironment`` and ``SandboxOptions`` on first use: the environment stack is Harbor's
    and the chosen SDK's, which a caller that only builds a config (or a SkyPilot user without
    docker-py) need not load, and the options model is Harbor's too."""
    if name == "SandboxEnvironment":
        from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment

        return SandboxEnvironment
    if name == "SandboxOptions":
        from osmosis_harbor.sandbox.options import SandboxOptions

        return SandboxOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
