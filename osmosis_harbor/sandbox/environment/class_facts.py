"""What Harbor asks of our environment *class*, apart from any trial's sandbox: its options
model and parser (Harbor 0.26 validates ``--ek`` through them), its preflight, its type and
its capabilities (SkyPilot's: requests are limits, egress can be blocked, no GPUs)."""

from __future__ import annotations

from typing import Any, cast, override

from harbor.environments.base import BaseEnvironment
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.models.environment_type import EnvironmentType

from osmosis_harbor import settings
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox.options import SandboxOptions

__all__ = ["SandboxEnvironmentBase"]


class SandboxEnvironmentBase(BaseEnvironment):
    """What Harbor asks of our environment class itself, before any trial makes one."""

    # Harbor 0.26 validates ``--ek`` through it; ours carries Harbor's keywords too, hence the ignores.
    options_model = SandboxOptions  # type: ignore[assignment, unused-ignore]

    @classmethod
    def parse_options(cls, kwargs: dict[str, Any] | None = None) -> SandboxOptions:  # type: ignore[override, unused-ignore]
        """The kwargs as our options (`ConfigError`, a ValueError, naming what is wrong): they
        carry Harbor's own keywords beside ours, which Harbor's model check would refuse."""
        return SandboxOptions.build(**(kwargs or {}))

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:  # type: ignore[override, unused-ignore]
        """Before Harbor queues trials: valid kwargs, and what the chosen SDK needs here (not
        ``sky.sandbox`` whatever the SDK, as Harbor's SkyPilot class requires). Harbor 0.25
        passes no kwargs: nothing is checked then (a missing SDK still fails the trial, by name)."""
        error_policies.install()  # before Harbor's job runs a trial: our errors' policies
        if HARBOR.options_model:
            cast(Any, super()).preflight(kwargs)  # Harbor's base: parse_options
        if kwargs is not None:
            cls.parse_options(kwargs).impl.preflight(
                settings.current()
            )  # Harbor calls this before any environment exists

    @staticmethod
    @override
    def type() -> EnvironmentType:
        return EnvironmentType.SKYPILOT

    @classmethod
    @override
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        """A sandbox's requests are its limits (SkyPilot's pods: request == limit)."""
        return EnvironmentResourceCapabilities(cpu_request=True, cpu_limit=True, memory_request=True, memory_limit=True)

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        """All egress can be blocked, fixed at create; no hostname allowlist, no GPUs."""
        return EnvironmentCapabilities(
            disable_internet=True, network_allowlist=False, gpus=False, dynamic_network_policy=False
        )
