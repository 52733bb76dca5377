"""What both soak tests check the same way: the Docker soak (``tests/e2e/bench/test_soak.py``) and the
API-fault soak on the emulator (``tests/e2e/bench/test_soak_emulator.py``) differ in their faults, not in
what a clean run is. Sizes are the smallest that still give every planned kind a rollout."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from bench.soak_plan import Kind, Plan, SoakReport

PYTESTMARK = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


def plan_kinds(make_plans: Callable[[Any], list[Plan]], config: Any) -> Counter[Kind]:
    """The kinds ``config`` plans, after checking that the seed fixes them and that every
    rollout has its own id and its own key (the key-leak check tells rollouts apart by key)."""
    plans = make_plans(config)
    assert [p.kind for p in plans] == [p.kind for p in make_plans(config)]
    assert len({p.key for p in plans}) == len({p.rollout_id for p in plans}) == config.rollouts
    return Counter(p.kind for p in plans)


def assert_every_rollout_ended_as_planned(report: SoakReport, rollouts: int) -> Counter[str]:
    """Every rollout was accepted and reached a terminal state its plan allows; nothing was left
    (sandboxes, pools, ledger rows, temp dirs) and no key was found in a retained file; every
    success kept the files its key was written to, scrubbed. Returns the outcomes by name."""
    assert report.accepted == report.terminal == rollouts
    assert report.mismatches == []
    assert report.leftovers == []
    assert report.key_hits == []
    assert report.unproven == []
    return report.outcomes()
