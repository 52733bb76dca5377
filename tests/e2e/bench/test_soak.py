"""The fault-injection soak (bench/soak.py) at a size fit for CI: every fault kind at least
once (sandboxes killed with and without a successful retry, a cancel, an agent timeout, a
grader error) among right and wrong answers, through the real osmosis server, Harbor's
TrialQueue and Docker sandboxes. ``python -m bench --only soak`` runs 200."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.soak import run_soak
from bench.soak_plan import EXPECTED, FAULTS, Kind, SoakConfig, make_plans
from tests.support.soak import PYTESTMARK, assert_every_rollout_ended_as_planned, plan_kinds

pytestmark = PYTESTMARK

# One rollout per fault kind, one right and one wrong answer: the smallest soak with every plan
# (more than the queue's 4 slots, so rollouts still wait for one while others are faulted); the
# timed-out one holds its slot 3 s, not the 5 of the benchmark.
CONFIG = SoakConfig(rollouts=len(FAULTS) + 2, seed=8, deadline_sec=240, timeout_sec=3.0)


def test_plans_follow_the_seed_and_cover_every_fault() -> None:
    kinds = plan_kinds(make_plans, CONFIG)
    assert all(kinds[k] == 1 for k in FAULTS) and kinds[Kind.RIGHT] == kinds[Kind.WRONG] == 1
    big = Counter(p.kind for p in make_plans(SoakConfig()))
    assert sum(big[k] for k in FAULTS) == 20 and big[Kind.RIGHT] == big[Kind.WRONG] == 90
    with pytest.raises(ValueError, match="at least 5 rollouts"):
        make_plans(SoakConfig(rollouts=4))


async def test_every_rollout_ends_as_planned_and_nothing_is_left(tmp_path: Path) -> None:
    report = await run_soak(CONFIG, tmp_path / "soak")

    outcomes = assert_every_rollout_ended_as_planned(report, CONFIG.rollouts)
    for kind in FAULTS:  # each fault really produced its own outcome
        want = EXPECTED[kind]
        name = want.category.value if want.category else want.status.value
        assert outcomes[name] >= 1, (kind, outcomes)
