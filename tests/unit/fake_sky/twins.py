"""Every ``sky.sandbox`` call is blocking with an ``.aio`` coroutine twin: the fake's are made
from one coroutine each. The blocking twin runs it to the end on a loop of its own, so it is
for threads without a running loop (as SkyPilot's blocking calls are used from threads)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Twin"]


class Twin:
    """``call(...)`` blocks; ``await call.aio(...)`` does not."""

    def __init__(self, coroutine: Callable[..., Awaitable[Any]], *, blocking: Callable[..., Any] | None = None) -> None:
        self.aio = coroutine
        self._blocking = blocking
        # What the call takes, for callers that read a signature (capabilities, pool keywords).
        self.__signature__ = inspect.signature(coroutine)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._blocking is not None:
            return self._blocking(*args, **kwargs)
        return asyncio.run(_awaited(self.aio(*args, **kwargs)))


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
