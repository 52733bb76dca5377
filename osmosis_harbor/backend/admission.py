"""Requests refused at admission: what cannot succeed is found before any sandbox starts."""

from __future__ import annotations

import math
from urllib.parse import urlparse

from harbor.models.trial.config import EnvironmentConfig
from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.shim import contract

__all__ = ["MAX_ROLLOUT_ID_BYTES", "endpoint_problem", "relays_endpoint", "request_problem", "requires_public_url"]

# The rollout id reaches the sandbox as ``OSMOSIS_ROLLOUT_ID=<id>`` in the workflow's exec
# environment; Linux caps one environment string at 128 KiB (MAX_ARG_STRLEN), NUL included.
MAX_ROLLOUT_ID_BYTES = 32 * 4096 - len(f"{contract.ROLLOUT_ID_ENV}=") - 1
# Native agents whose model client runs inside the sandbox (and so must reach the endpoint
# from there); terminus-2 calls the model from the host process.
IN_SANDBOX_CLIENTS = frozenset({"mini-swe-agent"})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})


def request_problem(request: ExecutionRequest) -> str | None:
    """Why ``request`` cannot succeed, found before any sandbox starts (else None).

    Harbor reads a zero timeout as "the task's default" and starts a sandbox for a negative
    one only to time it out, so a deadline must be a positive number of seconds (None: the
    task's own). Every id the osmosis server accepts works (paths derive from the trial
    name), except one too long to reach the sandbox at all."""
    for name in ("agent_timeout_sec", "grader_timeout_sec"):
        value = getattr(request, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            return f"{name} must be a positive number of seconds (omit it for the task's own timeout), got {value}"
    size = len(request.id.encode("utf-8", "surrogatepass"))
    if size > MAX_ROLLOUT_ID_BYTES:
        return (
            f"rollout_id is {size} bytes long; at most {MAX_ROLLOUT_ID_BYTES} fit in the sandbox's "
            f"{contract.ROLLOUT_ID_ENV} environment variable"
        )
    return None


def endpoint_problem(options: BackendOptions, environment: EnvironmentConfig, url: str) -> str | None:
    """Why the rollout's chat endpoint cannot be reached from where its model client runs."""
    if options.is_native and options.agent == "oracle":
        return None
    if not url:
        return "the rollout has no chat-completions URL (no active RolloutContext)"
    sandbox = SandboxOptions.of(environment)
    if _client_in_sandbox(options) and _on_loopback(url) and not sandbox.host_network and not _relays(sandbox):
        return (
            f"the chat-completions endpoint {url} is on this machine's loopback, which "
            f"{sandbox.sdk!r} sandboxes cannot reach; serve it on a "
            "routable address, or use local Docker sandboxes (environment_config('docker')), "
            "which reach it through the policy relay"
        )
    return None


def relays_endpoint(options: BackendOptions, environment: EnvironmentConfig, url: str) -> bool:
    """Whether the rollout's endpoint reaches its sandbox through the policy relay: a model
    client in the sandbox, an endpoint on the host's loopback, sandboxes whose implementation
    relays, and no explicit ``host_network=True`` (which reaches the loopback directly)."""
    sandbox = SandboxOptions.of(environment)
    return (
        bool(url)
        and not (options.is_native and options.agent == "oracle")
        and _client_in_sandbox(options)
        and _on_loopback(url)
        and not sandbox.host_network
        and _relays(sandbox)
    )


def requires_public_url(options: BackendOptions, environment: EnvironmentConfig) -> bool:
    """Whether the chat endpoint must be reachable from beyond this machine: a model client in
    the sandbox, sandboxes that do not reach this host's loopback (no relay, no host network)."""
    if options.is_native and options.agent == "oracle":
        return False
    sandbox = SandboxOptions.of(environment)
    return _client_in_sandbox(options) and not sandbox.host_network and not _relays(sandbox)


def _client_in_sandbox(options: BackendOptions) -> bool:
    return not options.is_native or options.agent in IN_SANDBOX_CLIENTS


def _on_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _relays(sandbox: SandboxOptions) -> bool:
    return sandbox.impl.relays_host_endpoint
