"""Pool autoscaling (``pool_size="auto"``): each warm pool sized from the claims it serves.

A pool sized by hand is either too small (claims fall through to cold creates when a burst
outruns the refill) or too large (idle sandboxes cost money between training steps). A pool
refills one member per claim, and a member takes ``replace_sec`` to start, so the members a
pool must hold idle to serve a claim rate ``r`` without a cold create are ``r * replace_sec``
(Little's law), times a headroom for bursts. ``PoolAutoscaler`` measures both: the claim rate
from the backend's claim counts (``SandboxStarts.claims``, an exponentially weighted rate over
its ticks) and the replace time from its own growth calls (``set_pool_size`` returns when the
new members run). It keeps each pool within ``[min_size, max_size]``, and shrinks a pool to
``min_size`` once it has served no claim for ``idle_sec``.

It runs as one background task owned by the backend (started after prewarm made the pools,
stopped at ``shutdown()``). Time is injectable: ``clock`` drives rates and idleness, so a test
can drive an hour in a few ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from osmosis_harbor import settings
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk

__all__ = ["AutoscalePolicy", "PoolAutoscaler"]

log = logging.getLogger(__name__)


class AutoscalePolicy(BaseModel):
    """The bounds and constants of pool autoscaling (settings ``OSMOSIS_HARBOR_POOL_*``)."""

    model_config = ConfigDict(frozen=True)

    min_size: int = 1
    max_size: int = 32
    idle_sec: float = 120.0
    interval_sec: float = 5.0
    replace_sec: float = 5.0  # the first estimate of a member's start time, until one is measured
    headroom: float = 1.5
    smoothing: float = 0.5  # weight of the newest rate in the moving average

    @classmethod
    def from_settings(cls, current: settings.Settings) -> AutoscalePolicy:
        return cls(
            min_size=current.pool_min,
            max_size=max(current.pool_max, current.pool_min),
            idle_sec=current.pool_idle_sec,
            interval_sec=current.pool_autoscale_interval_sec,
        )


@dataclass
class _Pool:
    size: int
    seen: int  # the claim count at the last tick
    rate: float = 0.0  # claims per second, smoothed
    last_claim_at: float = 0.0


class PoolAutoscaler:
    """Resizes warm pools from their observed claim rate (see the module docstring)."""

    def __init__(
        self,
        sdk: SandboxSdk,
        pools: Sequence[str],
        claims: Mapping[str, int],
        policy: AutoscalePolicy,
        *,
        initial_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sdk = sdk
        self.policy = policy
        self._claims = claims  # live counts, read at each tick
        self._clock = clock
        now = clock()
        counts = claims
        self._pools = {
            name: _Pool(size=initial_size, seen=counts.get(name, 0), last_claim_at=now) for name in sorted(set(pools))
        }
        self.replace_sec = policy.replace_sec
        self._last_tick = now
        self._task: asyncio.Task[None] | None = None

    def target(self, name: str) -> int:
        """The size a pool should have now."""
        pool, policy = self._pools[name], self.policy
        if self._clock() - pool.last_claim_at >= policy.idle_sec:
            return policy.min_size
        wanted = math.ceil(pool.rate * self.replace_sec * policy.headroom)
        return min(max(wanted, policy.min_size), policy.max_size)

    async def tick(self) -> dict[str, int]:
        """Observe the claims since the last tick and resize what needs it; returns the sizes."""
        now = self._clock()
        elapsed = max(now - self._last_tick, 1e-9)
        self._last_tick = now
        counts = self._claims
        for name, pool in self._pools.items():
            count = counts.get(name, 0)
            new_claims = count - pool.seen
            pool.seen = count
            if new_claims > 0:
                pool.last_claim_at = now
            smoothing = self.policy.smoothing
            pool.rate = smoothing * (new_claims / elapsed) + (1 - smoothing) * pool.rate
            target = self.target(name)
            if target != pool.size:
                await self._resize(name, pool, target)
        return {name: pool.size for name, pool in self._pools.items()}

    async def _resize(self, name: str, pool: _Pool, target: int) -> None:
        started = time.perf_counter()  # the real time members take to start, whatever the clock
        try:
            await self.sdk.set_pool_size.aio(name, target)
        except Exception as exc:  # a failed resize is retried at the next tick
            log.warning("could not resize pool %s to %d: %s", name, target, exc)
            return
        if target > pool.size:
            measured = time.perf_counter() - started
            self.replace_sec = 0.5 * self.replace_sec + 0.5 * measured
        log.info("pool %s: %d -> %d members (%.2f claims/s)", name, pool.size, target, pool.rate)
        pool.size = target

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.policy.interval_sec)  # the control period, not a synchronisation
            await self.tick()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def state(self) -> dict[str, dict[str, float]]:
        """What ``health()`` shows per pool."""
        return {
            name: {"size": pool.size, "claims_per_sec": round(pool.rate, 3), "replace_sec": round(self.replace_sec, 3)}
            for name, pool in self._pools.items()
        }
