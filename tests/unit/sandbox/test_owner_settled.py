"""An owner's wait for the terminations it settles later (``SandboxOwner.settled``) waits only
for those still running, and ``close`` bounds it. A done one left in the set (its done callback
had not removed it) made ``settled`` a busy loop on the event loop's thread that no timeout ended:
a backend's shutdown spun there until the test's timeout, ten minutes. Each case runs its loop in
a thread of its own, so that a loop that spins fails the test instead of hanging it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from osmosis_harbor import settings
from osmosis_harbor.sandbox.owner import context
from osmosis_harbor.sandbox.owner.context import SandboxOwner

BOUND_SEC = 20.0


def _finishes(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """``asyncio.run(main())`` in a daemon thread; fails when it has not finished in BOUND_SEC."""
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(asyncio.run(main())), daemon=True)
    thread.start()
    thread.join(BOUND_SEC)
    assert not thread.is_alive(), f"the owner's loop did not finish in {BOUND_SEC:g} s (it spins)"
    return outcome[0]


def test_a_done_termination_left_in_the_set_does_not_make_settled_spin() -> None:
    async def main() -> int:
        owner = SandboxOwner.make("test", config=settings.current())
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        owner._ending.add(done)  # done, and no done callback will remove it
        await asyncio.wait_for(owner.settled(), BOUND_SEC / 2)
        return len(owner._ending)

    assert _finishes(main) == 0


def test_settled_waits_for_a_running_termination_and_close_bounds_one_that_never_ends(monkeypatch) -> None:
    monkeypatch.setattr(context, "CLOSE_SETTLE_SEC", 0.5)

    async def main() -> tuple[bool, bool, list[str]]:
        owner = SandboxOwner.make("test", config=settings.current())
        finish, never = asyncio.Event(), asyncio.Event()
        owner.settle_later(finish.wait())
        settled = asyncio.ensure_future(owner.settled())
        await asyncio.sleep(0.05)
        waited = not settled.done()  # a running termination is waited for
        finish.set()
        await asyncio.wait_for(settled, BOUND_SEC / 2)
        owner.settle_later(never.wait())
        problems = await owner.close()  # bounded: the sweep runs after CLOSE_SETTLE_SEC
        return waited, settled.done(), problems

    waited, done, problems = _finishes(main)
    assert waited and done and problems == []
