"""Which environment group a sandbox belongs to, what that group's warm pool is made with, and
whether a pool can serve it at all: prewarm, validate and every trial of a task must agree on
all three."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode

from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner.pools import environment_group_key, pool_name_for, unserved

if TYPE_CHECKING:
    from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment

__all__ = ["declares_no_network", "group_key_of", "group_pool_of", "network_shape", "pool_refusal", "pool_shape_of"]


def declares_no_network(task_env: TaskEnvironmentConfig) -> bool:
    """The task's declared network mode (``allow_internet = false`` is read into it by Harbor)."""
    return task_env.network_mode == NetworkMode.NO_NETWORK


def group_key_of(env: SandboxEnvironment) -> str:
    """From the task's declared network mode, not the runtime policy Harbor derives per role
    and phase: prewarm and every trial of the task read the same declaration."""
    no_network = declares_no_network(env.task_env_config)
    return environment_group_key(env.environment_id, env._effective_cpus, env._effective_memory_mb, no_network)


def network_shape(options: SandboxOptions, *, no_network: bool) -> dict[str, bool]:
    """A sandbox's network keywords: none at all, or the host's (a local SDK's opt-in, which a
    task without a network never gets)."""
    shape = {"block_network": no_network}
    if options.impl.reaches_host and options.host_network and not no_network:
        shape["host_network"] = True
    return shape


def pool_shape_of(env: SandboxEnvironment) -> dict[str, Any]:
    memory_mb = env._effective_memory_mb
    return {
        "cpus": env._effective_cpus,
        "memory_gb": memory_mb / 1024 if memory_mb else None,
        **network_shape(env.options, no_network=env._network_disabled),
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


def group_pool_of(env: SandboxEnvironment) -> str | None:
    """The group pool this environment claims from under its pool base name, or None when that
    pool cannot serve it (`pool_refusal`, said once in the trial's log): it is created cold."""
    options = env.options
    assert options.pool is not None
    refusal = pool_refusal(options, no_network=env._network_disabled)
    if refusal is not None:
        env.logger.warning("%s", refusal)
        return None
    return pool_name_for(options.pool, env.group_key)
