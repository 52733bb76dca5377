"""What a task's real solution may change, and the verdict on one check against it.

An allowance is what ``validate --agent oracle`` saw the task's own ``solve.sh`` do to the
verifier's toolchain (each change with its content hash, and the ports its services listened on),
plus what the task declares in ``task.toml`` (path globs, any content; service ports). A rollout's
change passes when the allowance has the same change (same path, kind, type and content hash) or
a glob covering its path; its processes survive the check when they listen on an allowed port.
Everything else the check found means the verifier's environment was tampered with.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_harbor.sandbox.guard.report import Finding, GuardReport

__all__ = ["Allowance", "Verdict", "judge"]

# Messages name at most this many problems (the metrics and the log have the count).
_NAMED = 8


@dataclass(frozen=True)
class Allowance:
    """Changes and services a task's solutions may leave (see the module docstring)."""

    changes: frozenset[tuple[str, str, str, str]] = frozenset()  # (kind, type, path, digest)
    globs: tuple[str, ...] = ()
    ports: frozenset[int] = frozenset()

    @staticmethod
    def recorded(report: GuardReport) -> Allowance:
        """What one check saw a real solution leave: every finding, and its listening ports."""
        return Allowance(
            frozenset((f.kind, f.type, f.path, f.digest) for f in report.findings), (), frozenset(report.listening)
        )

    def merged(self, other: Allowance) -> Allowance:
        return Allowance(self.changes | other.changes, self.globs + other.globs, self.ports | other.ports)

    def allows(self, finding: Finding) -> bool:
        if (finding.kind, finding.type, finding.path, finding.digest) in self.changes:
            return True
        return any(fnmatch.fnmatchcase(finding.path, glob) for glob in self.globs)

    def dump(self) -> str:
        """JSON (paths may hold undecodable bytes as surrogates: json escapes them)."""
        return json.dumps({"changes": sorted(self.changes), "globs": list(self.globs), "ports": sorted(self.ports)})

    @staticmethod
    def load(text: str) -> Allowance:
        data: Any = json.loads(text)
        return Allowance(
            frozenset(tuple(map(str, c)) for c in data.get("changes", []) if len(c) == 4),  # type: ignore[misc]
            tuple(str(g) for g in data.get("globs", [])),
            frozenset(int(p) for p in data.get("ports", [])),
        )

    @staticmethod
    def read(path: Path) -> Allowance | None:
        try:
            return Allowance.load(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError):
            return None


@dataclass
class Verdict:
    """One check judged: tampered or not, why, and what it ended or kept."""

    tampered: bool
    reasons: list[str] = field(default_factory=list)
    killed: int = 0
    kept: int = 0

    def message(self) -> str:
        shown = "; ".join(self.reasons[:_NAMED])
        more = f" and {len(self.reasons) - _NAMED} more" if len(self.reasons) > _NAMED else ""
        return f"the verifier's environment was tampered with before the task's tests ran: {shown}{more}"


def judge(report: GuardReport, allowance: Allowance, *, processes_are_tampering: bool) -> Verdict:
    """The verdict on ``report``: every finding the allowance does not cover is a reason; so is a
    process left running (when ``processes_are_tampering``: a workflow's exec has ended, so what
    still runs was left on purpose; a native agent's harness keeps its terminal), one that would
    not die, a replaced ``/logs`` or ``/logs/verifier``, and a manifest that is gone or forged."""
    reasons: list[str] = []
    if report.manifest != "ok":
        reasons.append(f"the guard's record of the toolchain is {report.manifest}")
    if report.logs != "ok":
        reasons.append(
            {"replaced-logs": "/logs was replaced", "replaced-verifier": "/logs/verifier was replaced"}.get(
                report.logs, report.logs
            )
        )
    reasons += [f.describe() for f in report.findings if not allowance.allows(f)]
    if count := report.truncated.get("findings"):
        reasons.append(f"{count} more findings")
    if count := report.truncated.get("walk"):
        reasons.append(f"{count} toolchain entries the check could not cover (too many, too deep)")
    if processes_are_tampering:
        reasons += [f"{p.describe()} left running" for p in report.killed]
    reasons += [f"process {pid} could not be ended" for pid in report.unkillable]
    return Verdict(bool(reasons), reasons, killed=len(report.killed), kept=len(report.kept))
