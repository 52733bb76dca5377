"""The verifier guard: a task's own tests, run in the agent's sandbox, that a root workflow
cannot forge (docs/threat-model.md, "What a workflow can and cannot do to its reward").

A static program (``guard.c``, built by ``binary.py``) is started while the sandbox is pristine
and re-executes itself from a sealed memfd as a daemon holding a key the host made. Every command
of the agent phase runs through it and loses one capability (the mark), so no agent process can
ptrace it or read its key. Before the tests, the host runs its check: every marked process but
the task's services ends, the verifier's toolchain is compared with the record made before the
agent ran, and the findings come back signed (``report.py``), judged against what the task's real
solution may change (``allowance.py``). The trial's state is ``session.py``; the environment's
commands ``environment/verifier_guard.py``.
"""

from osmosis_harbor.sandbox.guard.allowance import Allowance, Verdict, judge
from osmosis_harbor.sandbox.guard.binary import GuardBinary, guard_binary
from osmosis_harbor.sandbox.guard.report import Finding, GuardReport, ReportRejected, parse_report
from osmosis_harbor.sandbox.guard.session import (
    GuardCheck,
    GuardPlan,
    GuardSession,
    GuardStage,
)

__all__ = [
    "Allowance",
    "Finding",
    "GuardBinary",
    "GuardCheck",
    "GuardPlan",
    "GuardReport",
    "GuardSession",
    "GuardStage",
    "ReportRejected",
    "Verdict",
    "guard_binary",
    "judge",
    "parse_report",
]
