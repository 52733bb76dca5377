"""Blocking calls with ``.aio`` twins, run on the SDK calls' own thread pool.

The ``sky.sandbox`` API shape is "every call is a blocking function that also offers an
``.aio`` coroutine". This module gives our SDKs (the Docker SDK and the emulator's client) that
shape: a dedicated executor (sized for many concurrent exec waits; the default executor is small
and shared with the rest of the program) and `Dual`, which wraps a blocking function or method so
it gains ``.aio``. It imports neither Docker nor HTTP, so either SDK can use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from osmosis_harbor import settings

log = logging.getLogger(__name__)


_executor_lock = threading.Lock()
_executor_instance: concurrent.futures.ThreadPoolExecutor | None = None


def executor() -> concurrent.futures.ThreadPoolExecutor:
    """The SDKs' own pool, made once per process: every running exec holds one thread while it
    streams output. Its size (``OSMOSIS_HARBOR_DOCKER_SDK_THREADS``) is read when it is made, the
    one object both SDKs' calls share: it bounds the rollouts a process holds in flight; threads
    start only when needed, so a high bound costs nothing until it is used."""
    global _executor_instance
    with _executor_lock:
        if _executor_instance is None:
            _executor_instance = concurrent.futures.ThreadPoolExecutor(
                max_workers=settings.current().docker_sdk_threads, thread_name_prefix="osmosis-docker-sdk"
            )
        return _executor_instance


def _abandon(callback: Callable[[Any], None], future: concurrent.futures.Future[Any]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    try:
        callback(future.result())
    except Exception:
        log.exception("cleanup of an abandoned call failed")


async def run_blocking[R](fn: Callable[[], R], *, on_abandon: Callable[[R], None] | None = None) -> R:
    """Run *fn* on the SDK executor; if the awaiting task is cancelled, clean up its result.

    Without ``on_abandon`` a ``create.aio`` cancelled mid-flight would leave a container nobody
    holds a handle to (until its TTL).
    """
    future = executor().submit(fn)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        if on_abandon is not None:
            future.add_done_callback(functools.partial(_abandon, on_abandon))
        raise


class Dual[**P, R]:
    """A blocking callable that also offers ``.aio`` (the shape of the ``sky.sandbox`` API).

    Works on module functions and, as a descriptor, on methods.
    """

    def __init__(self, fn: Callable[P, R], *, on_abandon: Callable[[R], None] | None = None) -> None:
        self._fn = fn
        self._on_abandon = on_abandon
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._fn(*args, **kwargs)

    async def aio(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return await run_blocking(functools.partial(self._fn, *args, **kwargs), on_abandon=self._on_abandon)

    def __get__(self, obj: object, objtype: type | None = None) -> Dual[..., R]:
        if obj is None:
            return self
        bound: Callable[..., R] = functools.partial(self._fn, obj)  # type: ignore[arg-type]
        return Dual(bound, on_abandon=self._on_abandon)


def dual[**P, R](fn: Callable[P, R]) -> Dual[P, R]:
    """Decorator form of `Dual`."""
    return Dual(fn)
