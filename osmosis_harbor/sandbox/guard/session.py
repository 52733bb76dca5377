"""One trial's verifier guard: its plan, where its agent phase stands, and what its checks found.

Whoever submits a trial whose task's tests run in the agent's sandbox (a backend, a validation
run) opens a scope with it (``owner.context.guard_scope``, or ``trial_scope(guard=...)``); the
trial's agent environment carries it in its trial context, and Harbor's ``AGENT_START`` /
``VERIFICATION_START`` hooks (``owner.context.add_guard_hooks``) move its phase: from
the first agent command on, every command goes through the guard's ``drop`` (the downloads of the
agent's outputs after its run too: the agent's processes still live then); once verification
starts, the next command first runs the check. The session is plain state; the commands are the
environment's (``environment.verifier_guard.VerifierGuardExecs``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum

from osmosis_harbor.errors import VerifierTamperedError
from osmosis_harbor.sandbox.guard.allowance import Allowance, Verdict
from osmosis_harbor.sandbox.guard.report import GuardReport

__all__ = ["GuardCheck", "GuardPlan", "GuardSession", "GuardStage"]


@dataclass(frozen=True)
class GuardPlan:
    """What the guard of one trial enforces, decided by whoever submits it."""

    allowance: Allowance = Allowance()
    # A workflow's exec has ended when its phase does: anything still running was left behind
    # on purpose. A native agent's harness keeps its terminal session: killed, never blamed.
    processes_are_tampering: bool = True
    # validate's oracle run: keep every service the solution left listening, and let the check
    # record what it saw as the task's allowance (``GuardCheck.report``).
    record_allowance: bool = False


class GuardStage(Enum):
    """Where one sandbox stands in the guard's check, apart from the trial's phase (``TrialPhase``)
    and the shim's (``shim.models.Phase``): the guard moves on commands, not on Harbor's steps."""

    FRESH = "fresh"  # no agent command has run: the sandbox is what the host made it
    AGENT = "agent"  # the agent phase and after it, until verification: every command is marked
    PENDING = "pending"  # verification starts: the next command first runs the check
    VERIFIED = "verified"  # the check passed: the verifier's commands run as the host's own
    TAMPERED = "tampered"


@dataclass(frozen=True)
class GuardCheck:
    """One check: the verified report and its verdict."""

    report: GuardReport
    verdict: Verdict


@dataclass
class GuardSession:
    """The guard state of one trial's agent sandbox (see the module docstring)."""

    plan: GuardPlan
    stage: GuardStage = GuardStage.FRESH
    daemon_pid: int | None = None
    key: bytes | None = None
    record_id: str | None = None
    recorded_since_check: bool = False  # the manifest is the toolchain as the last check left it
    checks: list[GuardCheck] = field(default_factory=list)
    tampered: VerifierTamperedError | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def agent_starts(self) -> None:
        if self.stage in (GuardStage.FRESH, GuardStage.VERIFIED, GuardStage.PENDING):
            # PENDING: no command ran since verification started (the step's verifier had a
            # sandbox of its own): the next check compares against the older record.
            self.stage = GuardStage.AGENT

    def verification_starts(self) -> None:
        if self.stage is GuardStage.AGENT:
            self.stage = GuardStage.PENDING

    @property
    def services_kept(self) -> int:
        return max((check.verdict.kept for check in self.checks), default=0)

    @property
    def processes_killed(self) -> int:
        return sum(check.verdict.killed for check in self.checks)

    def metrics(self) -> dict[str, float]:
        """What a rollout's sample carries about its guard (nothing when no check ran)."""
        if not self.checks and self.tampered is None:
            return {}
        metrics = {"verifier_tampered": 1.0 if self.tampered is not None else 0.0}
        if self.services_kept:
            metrics["verifier_services_kept"] = float(self.services_kept)
        if self.processes_killed:
            metrics["verifier_killed_processes"] = float(self.processes_killed)
        return metrics
