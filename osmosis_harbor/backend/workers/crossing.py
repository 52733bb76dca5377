"""What of a backend's options can cross into a worker process, checked when it is made.

Why: a worker rebuilds the backend from the front's options. What cannot be rebuilt there
(hooks on the user's orchestrator, a ``TrialQueue`` subclass, per-agent concurrency pools,
an option that does not pickle, a fixed relay port that N relays cannot share) would be lost
silently; each is refused by name instead, saying what to do.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

from osmosis_harbor.backend.options import BackendOptions
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.harbor_compat.queue_facts import QueueFacts

__all__ = ["checked_facts", "pickled_options", "shares"]

# Set by the front for each worker (its share of the queue, its trials dir and work root).
# The settings are each process's own reading of the same environment.
_NOT_CARRIED = frozenset({"orchestrator", "workers", "trials_dir", "settings"})


def checked_facts(facts: QueueFacts, count: int, relay_port: int) -> None:
    """Refuse an orchestrator the workers could not rebuild."""
    prefix = f"HarborBackend(workers={count})"
    if facts.queue_class != "TrialQueue":
        raise ConfigError(
            f"{prefix}: orchestrator is a {facts.queue_class}, which a worker process cannot rebuild "
            "(each makes a plain TrialQueue); pass a TrialQueue, or workers=1"
        )
    if facts.hooks:
        raise ConfigError(
            f"{prefix}: orchestrator has hooks ({', '.join(facts.hooks)}), which cannot run in the worker "
            "processes that run the trials; remove them (the backend's rollout_status and health report "
            "each rollout's progress), or pass workers=1"
        )
    if facts.agent_limits:
        raise ConfigError(
            f"{prefix}: orchestrator has per-agent concurrency pools ({', '.join(facts.agent_limits)}), "
            "which N queues cannot share; drop them, or pass workers=1"
        )
    if facts.n_concurrent < count:
        raise ConfigError(
            f"{prefix}: the orchestrator's n_concurrent={facts.n_concurrent} cannot be shared by {count} "
            f"workers (each needs one slot at least); raise n_concurrent or lower workers"
        )
    if relay_port != 0:
        raise ConfigError(
            f"{prefix}: OSMOSIS_HARBOR_RELAY_PORT={relay_port} is one port, and each "
            "worker runs a policy relay of its own; leave it unset (ephemeral ports), or pass workers=1"
        )


def shares(n_concurrent: int, count: int) -> list[int]:
    """The queue's slots spread over ``count`` workers (the first ones take the remainder)."""
    base, extra = divmod(n_concurrent, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def pickled_options(options: BackendOptions, count: int) -> str:
    """The options a worker rebuilds its backend from, pickled (base64), or a refusal naming the
    option that cannot cross."""
    carried: dict[str, Any] = {}
    for name in BackendOptions.model_fields:
        if name in _NOT_CARRIED:
            continue
        value = getattr(options, name)
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise ConfigError(
                f"HarborBackend(workers={count}): option {name}= cannot cross to a worker process "
                f"({type(exc).__name__}: {exc}); pass an importable class or an import path, or workers=1"
            ) from None
        carried[name] = value
    return base64.b64encode(pickle.dumps(carried)).decode()
