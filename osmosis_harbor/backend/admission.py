"""Requests refused at admission: what cannot succeed is found before any sandbox starts."""

from __future__ import annotations

import math
from urllib.parse import urlparse

from harbor.models.trial.config import EnvironmentConfig
from osmosis_ai.rollout.types import ExecutionRequest

from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.shim import contract

__all__ = ["MAX_ROLLOUT_ID_BYTES", "endpoint_problem", "request_problem"]

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
    host = urlparse(url).hostname or ""
    in_sandbox = not options.is_native or options.agent in IN_SANDBOX_CLIENTS
    if (
        in_sandbox
        and (host in LOOPBACK_HOSTS or host.startswith("127."))
        and not environment.kwargs.get("host_network")
    ):
        return (
            f"the chat-completions endpoint {url} is on this machine's loopback, which the "
            "sandbox cannot reach; serve it on a routable address, or for local Docker "
            "sandboxes use environment_config('docker', host_network=True)"
        )
    return None
