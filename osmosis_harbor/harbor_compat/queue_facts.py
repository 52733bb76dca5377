"""What a ``TrialQueue`` was made with, read from Harbor's private fields, and a queue made again
from it in another process.

Why: ``HarborBackend(workers=N)`` runs trials in N worker processes, each with a queue of its
own. A ``TrialQueue`` cannot cross a process (it holds asyncio semaphores and hook callables),
so each worker makes a fresh one from the user's concurrency and retry policy. Harbor exposes
neither: they are ``_n_concurrent``, ``_retry_config``, ``_hooks`` and
``_agent_pool_limits`` on 0.25 and 0.26 alike (verified), hence this module, the one place
that knows those names.
"""

from __future__ import annotations

from typing import Any

from harbor.models.job.config import RetryConfig
from harbor.trial.queue import TrialQueue
from pydantic import BaseModel, ConfigDict

__all__ = ["QueueFacts", "make_queue", "queue_facts", "queue_retry", "queue_slots"]


class QueueFacts(BaseModel):
    """A queue's concurrency, retry policy, and what a worker could not rebuild (hooks, per-agent
    limits, a subclass), named so that a refusal can say which."""

    model_config = ConfigDict(frozen=True)

    n_concurrent: int
    retry_config: dict[str, Any]  # RetryConfig in JSON form: it crosses to the workers
    hooks: tuple[str, ...] = ()  # "EVENT: qualified name" of each registered callback
    agent_limits: tuple[str, ...] = ()  # agent concurrency pools already set on the queue
    queue_class: str = "TrialQueue"

    def retry(self) -> RetryConfig:
        return RetryConfig.model_validate(self.retry_config)


def _callable_name(callback: Any) -> str:
    module = getattr(callback, "__module__", None) or "?"
    return f"{module}.{getattr(callback, '__qualname__', type(callback).__qualname__)}"


def queue_slots(queue: TrialQueue) -> int:
    """How many trials ``queue`` runs at once (the backend's gate has as many slots)."""
    return int(queue._n_concurrent)


def queue_retry(queue: TrialQueue) -> RetryConfig:
    """The retry policy ``queue`` runs by (the live object: a change to it is the queue's)."""
    retry: RetryConfig = queue._retry_config
    return retry


def queue_facts(queue: TrialQueue) -> QueueFacts:
    """The facts of ``queue`` (read before this backend adds hooks of its own)."""
    hooks = getattr(queue, "_hooks", {}) or {}
    named = tuple(
        f"{getattr(event, 'value', event)}: {_callable_name(callback)}"
        for event, callbacks in hooks.items()
        for callback in callbacks
    )
    retry = queue_retry(queue)
    cls = type(queue)
    return QueueFacts(
        n_concurrent=queue_slots(queue),
        retry_config=retry.model_dump(mode="json"),
        hooks=named,
        agent_limits=tuple(sorted(getattr(queue, "_agent_pool_limits", {}) or {})),
        queue_class="TrialQueue" if cls is TrialQueue else f"{cls.__module__}.{cls.__qualname__}",
    )


def make_queue(n_concurrent: int, retry_config: dict[str, Any]) -> TrialQueue:
    """A fresh queue with ``n_concurrent`` slots and the user's retry policy."""
    return TrialQueue(n_concurrent=n_concurrent, retry_config=RetryConfig.model_validate(retry_config))
