"""Which implementation of the ``sky.sandbox`` surface a sandbox environment talks to.

Production uses SkyPilot's Sandbox SDK (``sky.sandbox``), which ships with the SkyPilot
Platform installer and not with PyPI's ``skypilot``. Locally and in tests we use our
Docker-backed implementation of the same surface (``osmosis_harbor.sandbox.docker``). The
choice is an explicit name (``sdk="docker"`` / ``sdk="skypilot"``) carried in the environment
kwargs, never a patched module global, so both can coexist in one process. What an
implementation can do beyond the common surface is data on its registration, not a string
comparison at the call site.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import cast

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError, DockerSdkMissingError, SandboxSdkMissingError, SandboxUnavailableError
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk

__all__ = [
    "DEFAULT_SDK",
    "SDK_NAMES",
    "SandboxImplementation",
    "implementation",
    "load_sandbox_sdk",
    "name_of",
    "register",
]

SKYPILOT_SDK_MISSING = (
    "The SkyPilot Sandbox SDK ('sky.sandbox') is not installed in this environment. "
    "It ships with the SkyPilot Platform installer, not with PyPI's 'skypilot' (which "
    "cannot be installed next to Harbor 0.25 or 0.26 and has no 'sky.sandbox'). Install the "
    "Platform Sandbox SDK into this virtualenv, run 'sky api login -e <endpoint>', and "
    'retry; or use the local Docker sandbox with --env docker / sdk="docker".'
)


@dataclass(frozen=True)
class SandboxImplementation:
    """One registered implementation of the ``sky.sandbox`` surface.

    ``reaches_host``: a sandbox can share the host's network (``host_network=True``) and so
    reach a server on this machine's loopback (an explicit opt-in, see docs/threat-model.md).
    ``relays_host_endpoint``: sandboxes run on this machine's Docker engine, on the sandboxes'
    bridge, so a rollout's chat endpoint on the host's loopback reaches them through the
    policy relay (``relay/policy_relay.py``) and nothing else of the host does; on SkyPilot the endpoint
    must be a public URL. ``local_images``: sandboxes run on the engine
    that builds task images, so without a registry images stay local (nothing is pushed).
    ``missing_hint``: what to install when the module cannot be imported. ``default_registry``:
    where task images are pushed when neither ``registry=`` nor ``OSMOSIS_HARBOR_REGISTRY`` says.
    ``max_concurrent_starts``: the default bound on sandboxes being created or claimed at once
    by one backend (``sandbox.starts``): what the provider's create rate comfortably takes.
    ``records_exec_results``: an exec's result is read over an API that may fault after the
    command started, so each exec keeps its result in the sandbox for a re-read
    (``exec_records.py``). ``local_server``: ``module:function`` stopping what this process
    started on this machine to serve the SDK (the emulator's on-demand server), called by
    ``stop_local_servers`` when a backend shuts down. ``ready_check``: ``module:function``
    raising `SandboxUnavailableError` when what the SDK talks to is not there (the engine, the
    emulator, a SkyPilot login), run by `preflight` after the import.
    ``exec_runs_sandbox_shell``: an exec's argv runs
    under a shell of the sandbox, found on the sandbox's own PATH (SkyPilot's ``sh -c``), so a root
    agent that plants that shell runs its program first, unmarked, in every later exec: the
    verifier guard cannot protect a shared verifier there (``tasks/verifier_shell.py``)."""

    name: str
    module: str
    reaches_host: bool = False
    relays_host_endpoint: bool = False
    local_images: bool = False
    missing_hint: str | None = None
    default_registry: str | None = None
    max_concurrent_starts: int = 8
    records_exec_results: bool = False
    local_server: str | None = None
    ready_check: str | None = None
    exec_runs_sandbox_shell: bool = False

    def preflight(self, config: settings.Settings) -> None:
        """Exit with the way out (``SystemExit``, as Harbor's preflight does) unless this SDK
        can be imported and what it talks to is there: checked before a run queues trials."""
        try:
            self.load()
            if self.ready_check is not None:
                module, _, function = self.ready_check.partition(":")
                getattr(importlib.import_module(module), function)(config)
        except (SandboxSdkMissingError, SandboxUnavailableError) as exc:
            raise SystemExit(f"sdk={self.name!r}: {exc}") from None

    def stop_local_servers(self) -> list[str]:
        """Stop the local servers this process started for this SDK (none for most SDKs)."""
        if self.local_server is None:
            return []
        module, _, function = self.local_server.partition(":")
        return list(getattr(importlib.import_module(module), function)())

    def load(self) -> SandboxSdk:
        try:
            return cast(SandboxSdk, importlib.import_module(self.module))
        except Exception as exc:  # a broken ~/.sky config raises more than ImportError
            if self.missing_hint is None:
                raise
            from osmosis_harbor.harbor_compat.missing_sdk import HarborSandboxSdkMissingError

            raise HarborSandboxSdkMissingError(self.name, self.missing_hint, exc, package=self.module) from exc


_REGISTRY: dict[str, SandboxImplementation] = {}


def register(impl: SandboxImplementation) -> SandboxImplementation:
    """Make ``impl`` selectable by its name (``sdk=`` / ``--env`` / ``sandbox-check --sdk``)."""
    _REGISTRY[impl.name] = impl
    return impl


# A local engine creates containers a few at a time; SkyPilot's control plane takes a burst.
register(
    SandboxImplementation(
        "docker",
        "osmosis_harbor.sandbox.docker",
        missing_hint=DockerSdkMissingError.HINT,
        reaches_host=True,
        relays_host_endpoint=True,
        local_images=True,
        max_concurrent_starts=8,
        ready_check="osmosis_harbor.sandbox.docker.engine:check_reachable",
    )
)
register(
    SandboxImplementation(
        "skypilot",
        "sky.sandbox",
        exec_runs_sandbox_shell=True,
        missing_hint=SKYPILOT_SDK_MISSING,
        max_concurrent_starts=128,
        records_exec_results=True,
        ready_check="osmosis_harbor.sandbox.sdk.skypilot_login:check_logged_in",
    )
)
# SkyPilot's SDK served by a local emulator (sandbox/emulator/): SkyPilot's limits on this machine.
register(
    SandboxImplementation(
        "skypilot-emulator",
        "osmosis_harbor.sandbox.emulator",
        exec_runs_sandbox_shell=True,
        local_images=False,
        default_registry="127.0.0.1:5000",
        relays_host_endpoint=True,
        max_concurrent_starts=32,
        records_exec_results=True,
        local_server="osmosis_harbor.sandbox.emulator.server.launcher:stop_started_servers",
        ready_check="osmosis_harbor.sandbox.emulator.server.launcher:check_reachable",
    )
)
DEFAULT_SDK = "skypilot"
SDK_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def implementation(name: str) -> SandboxImplementation:
    """The registered implementation called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown sandbox sdk {name!r}: choose one of {', '.join(_REGISTRY)}") from None


def name_of(sdk: object) -> str | None:
    """The registered name of an SDK module (None for one that is not registered)."""
    module = getattr(sdk, "__name__", None)
    return next((impl.name for impl in _REGISTRY.values() if impl.module == module), None)


def load_sandbox_sdk(name: str) -> SandboxSdk:
    """The module implementing the ``sky.sandbox`` surface for ``name``."""
    return implementation(name).load()
