"""The soak's plans and its report: what each rollout is made to meet, what must come of it,
and what the run saw. Kept apart from ``bench.soak``'s driver so that the emulator's soak
(``bench.soak_emulator``) and the tests share one definition of a plan."""

from __future__ import annotations

import random
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from osmosis_ai.rollout.types import (
    RolloutErrorCategory,
    RolloutResultResponse,
    RolloutStatus,
)

WORKFLOW = "rollout_fixtures.workflows:SoakWorkflow"
GRADER = "rollout_fixtures.graders:SoakGrader"
GRADER_ERROR_LABEL = "grader-error"  # rollout_fixtures.graders.GRADER_ERROR_LABEL (not importable here)
ANSWER = "42"
GATE = "/tmp/soak-gate"
# The workflow runs the command the policy replies with; this one blocks on the FIFO.
BLOCKING = f"mkfifo {GATE} && read x < {GATE} && echo {ANSWER} > answer.txt"


class Kind(StrEnum):
    """What a rollout's plan does to it (the values name it in the tables)."""

    RIGHT = "right answer"
    WRONG = "wrong answer"
    KILLED = "sandbox killed twice"  # the attempt and its retry: internal_error
    RECOVERED = "sandbox killed once"  # the retry is released: success
    CANCELLED = "cancelled"
    TIMEOUT = "agent timeout"
    GRADER_ERROR = "grader error"


FAULTS = (Kind.KILLED, Kind.RECOVERED, Kind.CANCELLED, Kind.TIMEOUT, Kind.GRADER_ERROR)
GATED = {Kind.KILLED, Kind.RECOVERED, Kind.CANCELLED, Kind.TIMEOUT}
RETRIED = {Kind.KILLED, Kind.RECOVERED}  # HarborBackend(infra_retries=1) runs them twice


@dataclass(frozen=True)
class Expected:
    """What the controller must receive for a plan."""

    status: RolloutStatus
    category: RolloutErrorCategory | None = None
    reward: float | None = None  # checked for successes
    attempts: int | None = None  # checked where the soak killed sandboxes
    disposition: str | None = None  # what POST /rollout/cancel must answer


_S, _F = RolloutStatus.SUCCESS, RolloutStatus.FAILURE
EXPECTED: dict[Kind, Expected] = {
    Kind.RIGHT: Expected(_S, reward=1.0),
    Kind.WRONG: Expected(_S, reward=0.0),
    Kind.KILLED: Expected(_F, RolloutErrorCategory.INTERNAL_ERROR, attempts=2),
    Kind.RECOVERED: Expected(_S, reward=1.0, attempts=2),
    Kind.CANCELLED: Expected(RolloutStatus.CANCELLED, disposition="cancelled_running"),
    Kind.TIMEOUT: Expected(_F, RolloutErrorCategory.TIMEOUT),
    Kind.GRADER_ERROR: Expected(_F, RolloutErrorCategory.VALIDATION_ERROR),
}


@dataclass(frozen=True)
class SoakConfig:
    """One soak's size and knobs; the seed fixes which rollout gets which plan."""

    rollouts: int = 200
    seed: int = 8
    fault_rate: float = 0.10  # at least one of each fault kind whatever the size
    concurrency: int = 4
    timeout_sec: float = 5.0  # agent_timeout_sec of the TIMEOUT plans
    infra_retries: int = 1
    deadline_sec: float | None = None  # for the whole batch; default 30 s per rollout

    @property
    def deadline(self) -> float:
        return self.deadline_sec if self.deadline_sec is not None else max(300.0, 30.0 * self.rollouts)


@dataclass(frozen=True)
class Plan:
    """One rollout: what it does and what must come of it."""

    rollout_id: str
    kind: Kind
    key: str

    @property
    def command(self) -> str:
        if self.kind is Kind.WRONG:
            return "echo 7 > answer.txt"
        return BLOCKING if self.kind in GATED else f"echo {ANSWER} > answer.txt"

    @property
    def label(self) -> str:
        return GRADER_ERROR_LABEL if self.kind is Kind.GRADER_ERROR else ANSWER

    @property
    def expected(self) -> Expected:
        return EXPECTED[self.kind]


def seeded_plans(
    special: Sequence[Kind], rollouts: int, rate: float, seed: int, prefix: str, what: str, why: str = ""
) -> list[Plan]:
    """``rollouts`` plans: ``rate`` of them (at least one of each) of the ``special`` kinds in
    turn, the rest right and wrong answers alternately, in an order fixed by ``seed``; every key
    is fresh and spelled so that its JSON-escaped and URL-encoded forms differ from it. ``what``
    (and ``why``) name the soak in the error when ``rollouts`` cannot hold one of each special kind."""
    count = max(len(special), round(rollouts * rate))
    if count > rollouts:
        raise ValueError(f"{what} needs at least {len(special)} rollouts{why}, got {rollouts}")
    kinds = [special[i % len(special)] for i in range(count)]
    kinds += [Kind.RIGHT if i % 2 == 0 else Kind.WRONG for i in range(rollouts - count)]
    random.Random(seed).shuffle(kinds)
    return [
        Plan(
            f"{prefix}-{i:03d}-{kind.name.lower().replace('_', '-')}",
            kind,
            f'sk-soak/{secrets.token_hex(12)}+"q"\\ é&x=1',
        )
        for i, kind in enumerate(kinds)
    ]


def make_plans(config: SoakConfig) -> list[Plan]:
    """The run's plans: one of each fault kind at least, the fault rate of them in all."""
    return seeded_plans(
        FAULTS, config.rollouts, config.fault_rate, config.seed, "soak", "a soak", " (one per fault kind)"
    )


@dataclass
class Observed:
    """What the controller and the infrastructure saw of one rollout."""

    accepted: bool = False
    result: RolloutResultResponse | None = None
    error: str | None = None  # admission or result polling failed
    injection_error: str | None = None
    disposition: str | None = None
    submit_to_result_sec: float | None = None
    first_start: float | None = None  # the first attempt's start, where a retry followed
    run_sec: float | None = None  # first trial start to terminal, from the backend's tracker
    attempts: int | None = None
    trial_name: str | None = None


@dataclass
class SoakReport:
    """Everything one soak saw and found; the checks fill the lists that must stay empty."""

    config: SoakConfig
    plans: list[Plan]
    observed: dict[str, Observed]
    wall_sec: float
    prewarm_sec: float
    read_retries: int = 0
    leftovers: list[str] = field(default_factory=list)
    key_hits: list[str] = field(default_factory=list)
    hoards_scrubbed: int = 0
    unproven: list[str] = field(default_factory=list)  # successes whose trial lacks the scrubbed hoard
    mismatches: list[str] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return sum(o.accepted for o in self.observed.values())

    @property
    def terminal(self) -> int:
        return sum(o.result is not None for o in self.observed.values())

    def outcomes(self) -> Counter[str]:
        """Results by status, failures by category."""
        counts: Counter[str] = Counter()
        for o in self.observed.values():
            if o.result is None:
                counts["lost"] += 1
            elif o.result.status is RolloutStatus.FAILURE:
                counts[str(o.result.err_category.value if o.result.err_category else "failure")] += 1
            else:
                counts[o.result.status.value] += 1
        return counts

    def by_kind(self, attr: str) -> dict[Kind, list[float]]:
        samples: dict[Kind, list[float]] = {}
        for plan in self.plans:
            value = getattr(self.observed[plan.rollout_id], attr)
            if value is not None:
                samples.setdefault(plan.kind, []).append(value)
        return samples
