"""The API-fault soak on the skypilot-emulator (bench/soak_emulator.py) at a size fit for CI:
evictions once and twice among right and wrong answers, while the emulator answers 503 and 429,
resets connections at its seeded rates, and once on each kind of call (targeted), through the
real osmosis server, Harbor's TrialQueue and an emulator server of the test's own.
``nox -s bench -- --only soak --env skypilot-emulator`` runs 500."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from bench.emulator_server import start_emulator
from bench.soak_emulator import SANDBOX_IMAGE, EmulatorSoakConfig, make_plans, run_soak
from bench.soak_plan import Kind
from tests.support.emulator import SESSION_SERVERS
from tests.support.soak import PYTESTMARK, assert_every_rollout_ended_as_planned, plan_kinds

pytestmark = PYTESTMARK

CONFIG = EmulatorSoakConfig(rollouts=6, seed=16, deadline_sec=600)


def test_plans_follow_the_seed_and_evict_once_and_twice() -> None:
    kinds = plan_kinds(make_plans, CONFIG)
    assert kinds[Kind.KILLED] == kinds[Kind.RECOVERED] == 1 and kinds[Kind.RIGHT] + kinds[Kind.WRONG] == 4
    big = Counter(p.kind for p in make_plans(EmulatorSoakConfig()))
    assert big[Kind.KILLED] + big[Kind.RECOVERED] == 25  # 5 % of 500
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        make_plans(EmulatorSoakConfig(rollouts=1))


async def test_every_rollout_ends_as_planned_through_api_faults_and_evictions(tmp_path: Path) -> None:
    run = await asyncio.to_thread(start_emulator, SANDBOX_IMAGE, CONFIG.latency_ms, CONFIG.cold_create_sec, 0.0)
    SESSION_SERVERS.add(run.process.pid)  # its sandboxes are this session's for the leak check
    try:
        soak = await run_soak(CONFIG, tmp_path / "soak", run)
    finally:
        problems = await asyncio.to_thread(run.close)
    report, found = soak.report, soak.findings

    outcomes = assert_every_rollout_ended_as_planned(report, CONFIG.rollouts)
    assert problems == []
    assert found.unexplained == []
    # The faults were really there: every kind, on the rollouts' own sandboxes, and evictions
    # (the planned ones: twice for the rollout that ends lost, once for the one that recovers).
    assert {"503", "429", "reset"} <= set(found.injected), found.injected
    assert found.faulted_rollouts >= 1
    assert found.evicted >= 1  # 3 unless an API fault lost a planned rollout's sandbox first
    assert outcomes["internal_error"] >= 1 and outcomes["success"] >= 1, outcomes
