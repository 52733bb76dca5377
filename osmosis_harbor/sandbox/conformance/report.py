"""One run of the suite as data: the SDK's capabilities, every check's status, the counts.

A pass is only a check that ran and passed. Skipped and not-applicable checks are counted and
shown apart, so a run that skipped its way through the suite cannot read as a clean pass.
"""

from __future__ import annotations

from pydantic import BaseModel, computed_field

from osmosis_harbor.sandbox.conformance.capabilities import Capabilities
from osmosis_harbor.sandbox.conformance.core import CheckResult, CheckStatus

__all__ = ["ConformanceReport"]


class ConformanceReport(BaseModel):
    """What ``sandbox-check`` prints and writes with ``--json``."""

    sdk: str | None
    image: str
    capabilities: Capabilities
    results: list[CheckResult]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """How many checks ended in each status (every status listed, zeros included)."""
        return {status.value: sum(r.status is status for r in self.results) for status in CheckStatus}

    def ok(self, *, strict: bool = False) -> bool:
        """No check failed; with ``strict``, none skipped either (not-applicable never fails:
        the capability set shows why there was nothing to prove)."""
        bad = {CheckStatus.FAILED, CheckStatus.SKIPPED} if strict else {CheckStatus.FAILED}
        return not any(r.status in bad for r in self.results)

    def summary(self) -> str:
        counts = self.counts
        return ", ".join(f"{counts[s.value]} {s.value.replace('_', ' ')}" for s in CheckStatus)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def assumptions(self) -> dict[str, bool | None]:
        """Each assumption check's answer: held, did not hold, or None (it did not run)."""
        return {r.name: r.held for r in self.results if r.assumption is not None}

    def assumptions_summary(self) -> str:
        answers = list(self.assumptions.values())
        held, not_held = sum(a is True for a in answers), sum(a is False for a in answers)
        return f"{held} of {len(answers)} assumptions held, {not_held} did not, {len(answers) - held - not_held} not checked"
