"""The soak's checks: each result against its plan, the key in no retained file, the hoards
scrubbed, nothing left behind. Kept apart from ``bench.soak``'s driver; the emulator's soak
(``bench.soak_emulator``) uses the same result check."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.key_custody import MARKER
from osmosis_harbor.shim.errors import Redactor

from .env import managed_containers
from .soak_plan import Observed, Plan, SoakReport


def diagnostics(home: Path) -> dict[str, Path]:
    """The outcome extra fields the osmosis server saved, by rollout id."""
    root = home / ".osmosis"
    return {p.parent.name: p for p in root.rglob("diagnostics.json")} if root.exists() else {}


def read_attempts(report: SoakReport, home: Path) -> None:
    for rollout_id, path in diagnostics(home).items():
        seen = report.observed.get(rollout_id)
        if seen is not None:
            extra = json.loads(path.read_text())
            seen.attempts, seen.trial_name = extra.get("attempts"), extra.get("trial_name")


def mismatches(plan: Plan, seen: Observed) -> list[str]:
    """How what the controller got differs from the plan (empty when it does not)."""
    want, got = plan.expected, seen.result
    if got is None:
        return [f"{plan.rollout_id} ({plan.kind}): lost: {seen.error}"]
    problems = []
    if got.status is not want.status or got.err_category != want.category:
        problems.append(
            f"{got.status.value}/{got.err_category and got.err_category.value}, expected "
            f"{want.status.value}/{want.category and want.category.value}: {got.err_message}"
        )
    reward = got.sample.reward if got.sample is not None else None
    if want.status is RolloutStatus.SUCCESS and reward != want.reward:
        problems.append(f"reward {reward}, expected {want.reward}")
    if want.attempts is not None and seen.attempts != want.attempts:
        problems.append(f"{seen.attempts} attempt(s), expected {want.attempts}")
    if want.disposition is not None and seen.disposition != want.disposition:
        problems.append(f"cancel answered {seen.disposition}, expected {want.disposition}")
    if seen.injection_error:
        problems.append(f"fault not injected: {seen.injection_error}")
    return [f"{plan.rollout_id} ({plan.kind}): {p}" for p in problems]


def key_pattern(plans: list[Plan]) -> tuple[re.Pattern[bytes], dict[bytes, str]]:
    """One pattern for every spelling of every rollout's key (the Redactor's rules)."""
    owner = {s.encode(): p.rollout_id for p in plans for s in Redactor.for_key(p.key).secrets}
    assert len(owner) == 3 * len(plans), "each key must have three distinct spellings"
    return re.compile(b"|".join(re.escape(s) for s in sorted(owner, key=len, reverse=True))), owner


def key_hits(plans: list[Plan], roots: list[Path]) -> list[str]:
    pattern, owner = key_pattern(plans)
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            found = pattern.search(os.fsencode(path.name))
            if found is None and path.is_file() and not path.is_symlink():
                found = pattern.search(path.read_bytes())
            if found is not None:
                hits.append(f"{owner[found.group()]}'s key is in {path}")
    return hits


def hoards_scrubbed(trials: Path) -> int:
    """Files the workflows wrote their keys into that the trials kept, scrubbed: proof that
    the key check looked at files that had held keys."""
    return sum(1 for p in trials.rglob("hoard*") if p.is_file() and b"***" in p.read_bytes())


def unscrubbed_successes(report: SoakReport, trials: Path) -> list[str]:
    """Successful rollouts whose retained trial lacks the scrubbed hoard (it must be there)."""
    missing = []
    for plan in report.plans:
        seen = report.observed[plan.rollout_id]
        if seen.result is not None and seen.result.status is RolloutStatus.SUCCESS:
            hoard = trials / (seen.trial_name or "?") / "agent" / "hoard.txt"
            if not (hoard.is_file() and b"***" in hoard.read_bytes()):
                missing.append(f"{plan.rollout_id}: no scrubbed {hoard}")
    return missing


def check(report: SoakReport, trials: Path, home: Path, tmp: Path, sandboxes_at_end: list[str]) -> None:
    read_attempts(report, home)
    for plan in report.plans:
        report.mismatches += mismatches(plan, report.observed[plan.rollout_id])
    report.leftovers += [f"sandbox {name} still there after every rollout ended" for name in sandboxes_at_end]
    report.leftovers += [
        f"container {c['Names'][0].lstrip('/')} after shutdown" for c in managed_containers(os.getpid())
    ]
    report.leftovers += [f"temporary {p}" for p in tmp.iterdir()]
    report.leftovers += [f"unscrubbed marker {p}" for p in trials.rglob(MARKER)]
    report.key_hits = key_hits(report.plans, [trials, home / ".osmosis"])
    report.hoards_scrubbed = hoards_scrubbed(trials)
    report.unproven = unscrubbed_successes(report, trials)
