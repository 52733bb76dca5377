"""Which environment group a sandbox belongs to, what that group's warm pool is made with, and
whether a pool can serve it at all: prewarm, validate and every trial of a task must agree on
all three."""

from __future__ import annotations

import logging
from typing import Any

from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode

from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner.pools import pool_name_for, unserved

__all__ = ["declares_no_network", "group_pool", "network_shape", "pool_refusal", "pool_shape"]


def declares_no_network(task_env: TaskEnvironmentConfig) -> bool:
    """The task's declared network mode (``allow_internet = false`` is read into it by Harbor)."""
    return task_env.network_mode == NetworkMode.NO_NETWORK


def network_shape(options: SandboxOptions, *, no_network: bool) -> dict[str, bool]:
    """A sandbox's network keywords: none at all, or the host's (a local SDK's opt-in, which a
    task without a network never gets)."""
    shape = {"block_network": no_network}
    if options.impl.reaches_host and options.host_network and not no_network:
        shape["host_network"] = True
    return shape


def pool_shape(
    options: SandboxOptions, cpus: float | None, memory_mb: int | None, *, no_network: bool
) -> dict[str, Any]:
    """What a warm pool of an environment group is created with, besides its image."""
    return {
        "cpus": cpus,
        "memory_gb": memory_mb / 1024 if memory_mb else None,
        **network_shape(options, no_network=no_network),
    }


def pool_refusal(options: SandboxOptions, *, no_network: bool) -> str | None:
    """Why the warm pool ``options`` names cannot serve a task's sandboxes (None: it can, or no
    pool is named). The one decision behind prewarm's pools, validate's notes and each trial's
    claim: such a task runs cold, its own create with its own network, never a pool member's."""
    if not options.pool:
        return None
    reason = unserved(options.impl.load(), network_shape(options, no_network=no_network))
    if reason is None:
        return None
    return f"runs cold, not from warm pool {options.pool!r}: on {options.sdk}, {reason}"


def group_pool(options: SandboxOptions, group_key: str, *, no_network: bool, logger: logging.Logger) -> str | None:
    """The group pool an environment of group ``group_key`` claims from under its pool base name,
    or None when that pool cannot serve it (`pool_refusal`, said once in the trial's log): it is
    created cold. The group key is the task's declared network mode's (``declares_no_network``),
    not the runtime policy Harbor derives per role and phase: prewarm and every trial of the task
    read the same declaration."""
    assert options.pool is not None
    refusal = pool_refusal(options, no_network=no_network)
    if refusal is not None:
        logger.warning("%s", refusal)
        return None
    return pool_name_for(options.pool, group_key)
