"""What ``prewarm`` prints for its report (no sandbox): the groups' table, the leak audit's
findings when a group has any, ``--json``, and an exit status that findings alone never fail.
The real audits behind such a report: ``e2e/cli/test_leak_audit.py``'s training-server test
(the backend's prewarm of a leaking and a clean task); the command end to end:
``e2e/cli/test_prewarm_rollout_cleanup.py`` and the README's prewarm block."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.audit import AuditFinding, AuditKind, AuditSeverity, EnvironmentAudit
from osmosis_harbor.cli.prewarm import print_report
from osmosis_harbor.prewarm import PrewarmGroup, PrewarmReport

LEAK = AuditFinding(
    task_id="branch-leak",
    kind=AuditKind.GIT_HISTORY,
    severity=AuditSeverity.ERROR,
    path="/app/.git",
    evidence="1 commit(s) after HEAD",
    advice="ship the repository as a shallow clone",
    read_with="git log --all",
    repository="/app/.git",
    ref="refs/heads/fix",
)


def report(*, failed: int = 0, findings: list[AuditFinding] | None = None) -> PrewarmReport:
    def group(task_id: str, found: list[AuditFinding]) -> PrewarmGroup:
        audit = EnvironmentAudit(environment_id=f"env-{task_id}", task_ids=[task_id], findings=found, workdir="/app")
        return PrewarmGroup(
            key=task_id, environment_id=f"env-{task_id}", task_ids=[task_id], setup_ok=True, audit=audit
        )

    groups = [group("clean", []), group("branch-leak", [LEAK] if findings is None else findings)]
    return PrewarmReport(groups=2, tasks=2, built=0, reused=2, failed=failed, wall_sec=1.0, groups_detail=groups)


def args(json_path: Path | None = None) -> argparse.Namespace:
    return argparse.Namespace(settings=settings.current(), json=str(json_path) if json_path else None)


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A width no cell wraps at: what is printed is checked here, the layout elsewhere."""
    monkeypatch.setenv("COLUMNS", "240")


def test_findings_are_listed_and_do_not_fail_the_prewarm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prewarm.json"
    assert print_report(report(), args(out)) == 0
    printed = capsys.readouterr().out
    assert "Leak audit" in printed and "refs/heads/fix" in printed and "branch-leak" in printed
    groups = {tuple(g["task_ids"]): g for g in json.loads(out.read_text())["groups_detail"]}
    assert groups[("clean",)]["audit"]["findings"] == []
    (leak,) = groups[("branch-leak",)]["audit"]["findings"]
    assert (leak["kind"], leak["ref"], leak["severity"]) == ("git-history", "refs/heads/fix", "error")


def test_no_findings_no_audit_table_and_a_failed_task_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert print_report(report(findings=[]), args()) == 0
    assert "Leak audit" not in capsys.readouterr().out  # control: the table is there only for findings
    assert print_report(report(failed=1), args()) == 1
