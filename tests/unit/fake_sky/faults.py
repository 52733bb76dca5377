"""Faults a test asks the fake for: API errors on chosen calls, lost sandboxes, slow execs.

Each fault is explicit and counted, so a test states what goes wrong and when, and the fake
never fails on its own: ``fail("exec", times=2)`` makes the next two ``exec`` calls raise a 503
(or the exception given) before they do anything (``after=True``: a ``create`` that made its
sandbox and lost its answer); ``lose_on(name, "sleep")`` loses sandbox
``name`` the moment an exec whose argv contains ``sleep`` starts (the command then ends as on a
lost pod: its ``wait()`` raises "not found"); ``slow_exec(0.2)`` makes every exec take that
much longer before it starts, ``slow_create(0.1)`` answers a create that much later (a slow API
server).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import Unavailable

__all__ = ["Faults", "LossPlan"]


@dataclass
class _Failure:
    call: str
    error: BaseException | None
    times: int
    sandbox: str | None
    after: bool


@dataclass(frozen=True)
class LossPlan:
    """Lose ``sandbox`` when an exec containing ``word`` starts; ``status`` None: gone from
    ``ls()``, else still listed with that status (and ``message``, as an evicted pod)."""

    sandbox: str
    word: str
    status: str | None = None
    message: str | None = None


@dataclass
class Faults:
    """The faults armed on one fake cloud (`FakeSky.faults`)."""

    exec_delay: float = 0.0
    create_delay: float = 0.0
    _failures: list[_Failure] = field(default_factory=list)
    _losses: list[LossPlan] = field(default_factory=list)

    def fail(
        self,
        call: str,
        error: BaseException | None = None,
        *,
        times: int = 1,
        sandbox: str | None = None,
        after: bool = False,
    ) -> None:
        """The next ``times`` calls named ``call`` (of ``sandbox`` only, when given) raise ``error``
        (a 503 "not now" by default) without doing anything; with ``after`` (``create`` only),
        once they did it: the answer was lost, not the work."""
        self._failures.append(_Failure(call, error, times, sandbox, after))

    def slow_exec(self, seconds: float) -> None:
        self.exec_delay = seconds

    def slow_create(self, seconds: float) -> None:
        """``create`` makes its sandbox at once and answers ``seconds`` later (a slow API
        server): a caller cancelled meanwhile leaves a sandbox it must clean up."""
        self.create_delay = seconds

    def lose_on(self, sandbox: str, word: str, *, status: str | None = None, message: str | None = None) -> None:
        self._losses.append(LossPlan(sandbox, word, status, message))

    def check(self, call: str, sandbox: str | None = None, *, after: bool = False) -> None:
        """Raise the armed failure for this call, if one is armed (called by the fake)."""
        for failure in self._failures:
            if (
                failure.call == call
                and failure.sandbox in (None, sandbox)
                and failure.times > 0
                and failure.after == after
            ):
                failure.times -= 1
                raise failure.error or Unavailable(f"{call}: the API server is temporarily unavailable (injected)")

    def loss_for(self, sandbox: str, argv: Sequence[str]) -> LossPlan | None:
        """The loss armed for an exec of ``argv`` in ``sandbox`` (spent once returned)."""
        for plan in self._losses:
            if plan.sandbox == sandbox and any(plan.word in item for item in argv):
                self._losses.remove(plan)
                return plan
        return None
