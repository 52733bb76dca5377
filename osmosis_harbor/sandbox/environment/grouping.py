"""Which environment group a sandbox belongs to, and what that group's warm pool is made with:
prewarm and every trial of a task must agree on both."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harbor.models.task.config import NetworkMode

from osmosis_harbor.sandbox.owner.pools import environment_group_key

if TYPE_CHECKING:
    from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment

__all__ = ["group_key_of", "pool_shape_of"]


def group_key_of(env: SandboxEnvironment) -> str:
    """From the task's declared network mode, not the runtime policy Harbor derives per role
    and phase: prewarm and every trial of the task read the same declaration."""
    no_network = env.task_env_config.network_mode == NetworkMode.NO_NETWORK
    return environment_group_key(env.environment_id, env._effective_cpus, env._effective_memory_mb, no_network)


def pool_shape_of(env: SandboxEnvironment) -> dict[str, Any]:
    memory_mb = env._effective_memory_mb
    shape: dict[str, Any] = {
        "cpus": env._effective_cpus,
        "memory_gb": memory_mb / 1024 if memory_mb else None,
        "block_network": env._network_disabled,
    }
    if env.uses_host_network:
        shape["host_network"] = True
    return shape
