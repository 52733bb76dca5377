"""Benchmarks of osmosis-harbor, run by ``nox -s bench`` (``python -m bench``).

Each benchmark module measures one cost a user of the backend pays (orchestration
overhead per rollout, throughput, bundle builds, prewarm, admission) and reports MEDIANS
over repeated runs next to a BASELINE measured in the same run, so that the ratios stay
meaningful on a noisy machine where absolute timings are not. Nothing here asserts a
timing: benchmarks measure, print and write JSON (``bench/results/latest.json``).
"""
