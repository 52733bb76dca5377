"""Turning what the probe and the history scan saw into findings (pure: no sandbox here)."""

from __future__ import annotations

import posixpath
from collections import defaultdict

from osmosis_harbor.audit.fingerprints import Fingerprint
from osmosis_harbor.audit.git_history import HistoryScan
from osmosis_harbor.audit.models import ADVICE, AuditFinding, AuditKind, AuditSeverity, shown

__all__ = ["content_findings", "history_findings", "incomplete"]


def incomplete(task_ids: list[str], path: str, evidence: str) -> list[AuditFinding]:
    return [
        AuditFinding(
            task_id=task_id,
            kind=AuditKind.INCOMPLETE,
            severity=AuditSeverity.WARNING,
            path=shown(path),
            evidence=shown(evidence, 400),
            advice=ADVICE[AuditKind.INCOMPLETE],
        )
        for task_id in task_ids
    ]


def history_findings(task_ids: list[str], git_dir: str, scan: HistoryScan) -> list[AuditFinding]:
    found: list[AuditFinding] = []
    for beyond in scan.beyond:
        evidence = (
            f"{beyond.commits} commit(s) after HEAD {scan.head and scan.head[:12]} ({scan.head_date}), the newest "
            f"{beyond.newest_sha[:12]} of {beyond.newest_date}: {shown(beyond.subject, 120)!r}"
        )
        for task_id in task_ids:
            found.append(
                AuditFinding(
                    task_id=task_id,
                    kind=AuditKind.GIT_HISTORY,
                    severity=AuditSeverity.ERROR,
                    path=shown(git_dir),
                    evidence=evidence,
                    advice=ADVICE[AuditKind.GIT_HISTORY],
                    read_with=shown(beyond.read_with),
                    repository=shown(git_dir),
                    ref=shown(beyond.ref),
                )
            )
    if scan.incomplete:
        found.extend(incomplete(task_ids, git_dir, f"history scan {scan.incomplete}"))
    return found


def _copy_finding(task_id: str, path: str, prints: list[Fingerprint]) -> AuditFinding:
    expected = [p for p in prints if p.expected_output]
    role = prints[0].role
    kind = AuditKind.TESTS_COPY if role == "tests" else AuditKind.SOLUTION_COPY
    names = ", ".join(sorted({p.relpath for p in prints}))
    return AuditFinding(
        task_id=task_id,
        kind=kind,
        severity=AuditSeverity.ERROR if expected else AuditSeverity.WARNING,
        path=shown(path),
        evidence=f"same bytes (sha256 {prints[0].sha256[:16]}, {prints[0].size} bytes) as {names}"
        + (" (an expected output of the tests)" if expected else ""),
        advice=ADVICE[kind],
        read_with=f"cat {shown(path)}",
    )


def _directory_copies(task_id: str, copies: dict[str, list[Fingerprint]]) -> list[AuditFinding]:
    """One finding per file, and one more per sandbox directory holding several files of the
    same task directory: a copy of ``tests/`` or ``solution/`` itself."""
    found = [_copy_finding(task_id, path, prints) for path, prints in sorted(copies.items())]
    by_dir: dict[tuple[str, str], dict[str, Fingerprint]] = defaultdict(dict)
    for path, prints in copies.items():
        for p in prints:
            by_dir[(posixpath.dirname(path), p.role)][p.relpath] = p
    for (directory, role), held in sorted(by_dir.items()):
        if len(held) < 2:
            continue
        relpaths = sorted(held)
        kind = AuditKind.TESTS_COPY if role == "tests" else AuditKind.SOLUTION_COPY
        expected = any(p.expected_output for p in held.values())
        severity = AuditSeverity.ERROR if expected else AuditSeverity.WARNING
        found.append(
            AuditFinding(
                task_id=task_id,
                kind=kind,
                severity=severity,
                path=shown(directory),
                evidence=f"a copy of the task's {role}/ directory: {len(relpaths)} of its files "
                f"({', '.join(relpaths[:4])}{', ...' if len(relpaths) > 4 else ''})",
                advice=ADVICE[kind],
                read_with=f"ls {shown(directory)}",
            )
        )
    return found


def content_findings(
    task_id: str, prints: list[Fingerprint], hashes: list[tuple[str, str]], hits: list[tuple[str, str]]
) -> list[AuditFinding]:
    """Exact copies (by sha256) and files containing a distinctive line, for one task."""
    by_hash: dict[str, list[Fingerprint]] = defaultdict(list)
    by_line: dict[str, list[Fingerprint]] = defaultdict(list)
    for p in prints:
        by_hash[p.sha256].append(p)
        for line in p.lines:
            by_line[line].append(p)
    copies = {path: by_hash[digest] for digest, path in hashes if digest in by_hash}
    found = _directory_copies(task_id, copies)
    seen: set[str] = set(copies)
    for path, line in hits:
        if path in seen or line not in by_line:
            continue
        seen.add(path)
        names = ", ".join(sorted({p.relpath for p in by_line[line]}))
        found.append(
            AuditFinding(
                task_id=task_id,
                kind=AuditKind.CONTAINS,
                severity=AuditSeverity.WARNING,
                path=shown(path),
                evidence=f"contains a line of {names}: {shown(line, 80)!r}",
                advice=ADVICE[AuditKind.CONTAINS],
                read_with=f"grep -F ... {shown(path)}",
            )
        )
    return found
