"""The Harbor floor benchmark really runs Harbor's trials: each of its null-environment trials
comes back rewarded through Harbor's own verifier, the fast-path run has our replacements
installed and the as-shipped run has none (so the two figures compare what they claim to)."""

from __future__ import annotations

import math

from bench.harbor_floor import measure


def test_both_floor_runs_reward_every_trial_and_differ_only_in_the_fast_paths() -> None:
    shipped = measure(2, fastpaths=False)
    ours = measure(2, fastpaths=True)

    assert shipped["rewarded"] == 2 and ours["rewarded"] == 2
    assert shipped["fastpaths"] == []
    assert "harbor.models.task.file_filter:TaskFileFilter.is_excluded" in ours["fastpaths"]
    for figures in (shipped, ours):
        cpu = figures["cpu_per_trial_s"]
        assert isinstance(cpu, float) and math.isfinite(cpu) and cpu > 0
