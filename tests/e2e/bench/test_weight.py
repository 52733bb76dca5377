"""The weight benchmark's verdicts and the floor's one-group-left-out runs: a gain counts only
when the ranges of the two sides are apart, and a floor run without some fast paths really runs
Harbor's own functions for those (and ours for the rest)."""

from __future__ import annotations

from bench.common import BenchResult
from bench.harbor_floor import measure
from bench.weight import judge
from osmosis_harbor.harbor_compat import fastpaths


def test_a_gain_counts_only_when_the_ranges_are_apart() -> None:
    result = BenchResult("weight", "test")
    with_ = result.add("with", "s", [0.10, 0.11, 0.12])
    apart = result.add("without, apart", "s", [0.13, 0.15, 0.14])
    overlapping = result.add("without, overlapping", "s", [0.09, 0.16, 0.15])

    assert judge(result, "apart", apart, with_).startswith("gains")
    assert judge(result, "overlapping", overlapping, with_).startswith("no clear gain")  # its median is higher
    assert result.ratios[1].value > 1
    assert judge(result, "reversed", with_, apart).startswith("no clear gain")


def test_a_floor_run_without_some_fast_paths_keeps_harbors_own_for_those_only() -> None:
    labels = [f.label for f in fastpaths.FASTPATHS]
    left_out = tuple(label for label in labels if ".Packager." in label or "select_files" in label)
    figures = measure(2, fastpaths=True, without=left_out)

    assert figures["rewarded"] == 2
    assert left_out and sorted(figures["fastpaths"]) == sorted(set(labels) - set(left_out))  # type: ignore[arg-type]
