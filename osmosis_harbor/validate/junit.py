"""``validate --junit FILE``: the validation report as JUnit XML, which CI systems display natively.

One ``<testsuite>`` per run (named after the dataset), one ``<testcase>`` per task. A failed
task carries ``<failure type="<failed phase>" message="<phase>: <summary>">`` (the error's first
line, and the offline stand-in its base image was, if any) whose body is the whole error, the
stand-in note, then the task's row of the JSON report (rewards, timings, lint, trial
directory), so the two reports cannot disagree. Every test case's ``<system-out>`` holds its phase timings
and, passed or failed, its lint findings (``lint warning [rule] path: message``, one a line) and
leak audit findings (``audit error [git-history] /app/.git: ...``), so CI
sees a passing task's findings too; the schema CI tools validate against has no ``<properties>``
in a test case.
"""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta
from pathlib import Path

from osmosis_harbor.trials.printable import printable
from osmosis_harbor.validate import TaskValidation, ValidationReport
from osmosis_harbor.validate.lint import LintIssue


def _text(value: str) -> str:
    """``value`` as XML text: control characters (which XML 1.0 cannot carry even escaped, and
    a CI page would show raw) and lone surrogates spelled as escapes (``\\x1b``)."""
    return printable(value)


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def _timings(row: TaskValidation) -> str:
    if not row.timings_sec:
        return "no phase ran"
    return "phase timings: " + ", ".join(f"{phase} {sec:.3f}s" for phase, sec in row.timings_sec.items())


def _testcase(suite: ET.Element, row: TaskValidation, classname: str) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        classname=_text(classname),
        name=_text(row.id),
        time=_seconds(row.timings_sec.get("total", 0.0)),
    )
    findings = [_finding(issue) for issue in row.lint or []]
    if not row.passed:
        phase = row.failed_phase or "unknown"
        error = row.error or "failed"
        first = error.partition("\n")[0]
        summary = f"{phase}: {first}" + (f" ({row.stand_in})" if row.stand_in else "")
        failure = ET.SubElement(case, "failure", message=_text(summary), type=_text(phase))
        details = row.model_dump(mode="json", exclude={"id", "passed"}, exclude_none=True)
        note = f"\nnote: {row.stand_in}\n" if row.stand_in else ""
        failure.text = _text(f"{error}\n{note}\n{json.dumps(details, indent=2, ensure_ascii=False)}\n")
    leaks = [f"audit {f.severity} [{f.kind}] {f.path}: {f.evidence}" for f in row.audit or []]
    lines = [_timings(row), *(f"lint {f}" for f in findings), *leaks]
    ET.SubElement(case, "system-out").text = _text("\n".join(lines))


def _finding(issue: LintIssue) -> str:
    where = issue.path + (f":{issue.line}" if issue.line else "")
    return f"{issue.severity} [{issue.rule}] {where}: {issue.message}"


def junit_tree(report: ValidationReport, *, suite_name: str) -> ET.ElementTree:
    """The report as a ``<testsuites>`` document with one ``<testsuite>``."""
    started = datetime.now() - timedelta(seconds=report.wall_sec)
    counts = {
        "tests": str(len(report.tasks)),
        "failures": str(report.failed),
        "errors": "0",
        "skipped": "0",
        "time": _seconds(report.wall_sec),
    }
    root = ET.Element("testsuites", {"name": "osmosis-harbor validate", **counts})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": _text(suite_name),
            **counts,
            "timestamp": started.isoformat(timespec="seconds"),
            "hostname": _text(socket.gethostname()),
        },
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (("agent", report.agent), ("environment", report.environment)):
        ET.SubElement(properties, "property", name=name, value=_text(value))
    for row in report.tasks:
        _testcase(suite, row, suite_name)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(report: ValidationReport, path: Path, *, suite_name: str) -> None:
    """Write ``report`` to ``path`` as UTF-8 JUnit XML (``suite_name``: the dataset path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_tree(report, suite_name=suite_name).write(path, encoding="utf-8", xml_declaration=True)
