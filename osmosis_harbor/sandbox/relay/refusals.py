"""What the policy relay refused or failed of one rollout's calls, kept on the host for its outcome.

The relay is on the host, so what it refused and why is a fact the host saw, not the workflow's
claim. A rollout whose call the relay refused or failed through no fault of its own (the relay
full of other sandboxes' work, the policy endpoint unreachable or timing out for everyone:
``relay/blame.py`` says how the host tells), with no later
call of it answered by the policy, failed because of the infrastructure: its outcome is an ``internal_error``
(retried through ``infra_retries``), whatever its workflow then reported. A client that retried
and got through has recovered, and the refusal is only counted. Refusals of the rollout's own
making (over its bounds, too slow to send, a body that is not JSON, a call the endpoint failed
while it answered others) are counted and change nothing: the workflow got an error answer,
and the rollout is judged on what it made of it.

Written on the relay's thread, read on the backend's: the counters are updated under a lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from osmosis_harbor.sandbox.relay.limits import Blame, Refusal

__all__ = ["RelayRecord", "RelayReport"]


@dataclass(frozen=True)
class RelayReport:
    """A snapshot of a ``RelayRecord``: refusals counted by kind and by whose fault they were,
    and ``failure``, the reason of an infrastructure refusal no later answer recovered from."""

    own: dict[str, int] = field(default_factory=dict)
    infra: dict[str, int] = field(default_factory=dict)
    failure: str | None = None

    def failure_message(self) -> str | None:
        """The rollout's one-line error when the relay failed it, else None."""
        if self.failure is None:
            return None
        count = sum(self.infra.values())
        calls = "call" if count == 1 else f"calls ({count})"
        return f"the policy relay refused or failed this rollout's {calls} through no fault of its own: {self.failure}"

    def extra_fields(self) -> dict[str, Any]:
        """What goes into the outcome's ``extra_fields["relay"]`` (empty: nothing happened)."""
        refused = {name: counts for name, counts in (("own", self.own), ("infra", self.infra)) if counts}
        return {"refused": refused} if refused else {}


class RelayRecord:
    """One rollout's record, shared by its route (the relay writes) and its registration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._own: Counter[str] = Counter()
        self._infra: Counter[str] = Counter()
        self._failure: str | None = None

    def refused(self, refusal: Refusal) -> None:
        with self._lock:
            if refusal.blame is Blame.INFRA:
                self._infra[refusal.kind] += 1
                self._failure = refusal.reason
            else:
                self._own[refusal.kind] += 1

    def answered(self) -> None:
        """The policy answered a call of the rollout: an earlier refusal was recovered from."""
        if self._failure is not None:
            with self._lock:
                self._failure = None

    def clear(self) -> None:
        """Start afresh (a new attempt of the rollout's trial)."""
        with self._lock:
            self._own.clear()
            self._infra.clear()
            self._failure = None

    def report(self) -> RelayReport:
        with self._lock:
            return RelayReport(dict(self._own), dict(self._infra), self._failure)
