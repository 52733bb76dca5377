"""Under pytest-xdist, the longest test modules first.

Why: with ``--dist loadfile`` a worker takes the next module whenever it is free, so a long
module handed out last runs alone while the other workers have nothing left. xdist's own order
(modules with the most tests first) hands out the one-test benchmarks last; with
``--no-loadscope-reorder`` (``pyproject.toml``) the order is the collection's, sorted here. Handing the
longest modules out first (longest-processing-time-first) ends the workers together. The list
is the slowest modules of recent CI runs; a stale entry only costs balance, never a result:
modules are independent, and each one's own tests keep their order. Without xdist the order
is pytest's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .xdist_run import is_worker

LONGEST_FIRST = [
    "test_bench_hygiene.py",
    "test_verifier_guard.py",  # about 3.5 minutes: every attack, guarded and unguarded, on both SDKs
    "test_eval_harness.py",
    "test_prewarm_and_lifecycle.py",
    "test_cli_rollout_prewarm.py",
    "test_admission.py",
    "test_lost_sandbox_phases.py",
    "test_shutdown.py",
    "test_reward_integrity.py",
    "test_sandbox_check.py",
    "test_lost_in_harbor_transfers.py",
    "test_readme.py",
    "test_backend_e2e.py",
    "test_soak_emulator.py",
    "test_bench_emulator.py",
    "test_soak.py",
    "test_bench_scale.py",
    "test_base_images.py",
]


def _rank(item: pytest.Item) -> int:
    name = Path(str(item.path)).name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


class LongestFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items.sort(key=_rank)  # stable: every other module, and every module's tests, keep their order


def register(config: pytest.Config) -> None:
    if is_worker(config):  # every worker sorts alike: xdist requires one collection order
        config.pluginmanager.register(LongestFirst(), "osmosis-harbor-longest-first")
