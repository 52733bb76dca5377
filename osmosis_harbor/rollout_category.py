"""A rollout error category as a class attribute, resolved when first read.

``osmosis_ai.rollout.types`` imports the whole of ``osmosis_ai.rollout`` (its context, the
workflow base, their pydantic models: ~0.2 CPU-s). ``osmosis_harbor.errors`` is imported by every
command and by ``import osmosis_harbor``, most of which never read a category, so its classes
name theirs by value and the enum is imported by the first read of one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis_ai.rollout.types import RolloutErrorCategory

__all__ = ["LazyCategory"]


class LazyCategory:
    """``category = LazyCategory("agent_error")``: reads as ``RolloutErrorCategory.AGENT_ERROR``
    (the enum's own member, so ``is`` comparisons hold) on the class and on its instances."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __get__(self, instance: Any, owner: type | None = None) -> RolloutErrorCategory:
        from osmosis_ai.rollout.types import RolloutErrorCategory

        return RolloutErrorCategory(self.value)

    def __repr__(self) -> str:
        return f"LazyCategory({self.value!r})"
