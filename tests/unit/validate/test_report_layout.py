"""validate's report as a person reads it, rendered from rows (no sandbox): a 17-task dataset
at 80, 100, 120 and 160 columns, ids whole, one line per passing task, each failure in one
screen; control characters escaped in the table, the JUnit file and the JSON; stand-in notes
and redaction applied to the rows. ``test_reports.py`` runs the same on real sandboxes."""

from __future__ import annotations

import io
import json
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from osmosis_harbor.cli import PrintableFormatter
from osmosis_harbor.cli.validation_report import DETAIL_LINES, ValidationView, compact_seconds
from osmosis_harbor.sandbox.images.stand_ins import stand_in_note, what_stands_in
from osmosis_harbor.tasks.discovery import TaskRef
from osmosis_harbor.trials.printable import json_safe, printable
from osmosis_harbor.validate import TaskValidation, ValidationReport
from osmosis_harbor.validate.causes import note_causes, task_base_images
from osmosis_harbor.validate.json_report import report_json
from osmosis_harbor.validate.junit import junit_tree
from tests.support.report_rows import LONG_ID, PASSING, STAND_IN, seventeen_task_report

WIDTHS = (80, 100, 120, 160)
# What a terminal acts on: C0 (but tab and newline), DEL, C1, bidi controls, separators.
UNSHOWABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
HOSTILE_ID = "evil-\x1b[2J-\u202etxt.exe-\x07"


def render(report: ValidationReport, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False).print(ValidationView(report))
    return out.getvalue()


def table_rows(text: str) -> list[list[str]]:
    """The table's rows, each the lines it takes (a wrapped id takes several)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("task "))
    rows: list[list[str]] = []
    for line in lines[header + 2 :]:
        if not line.strip() or re.search(r"\d+ passed, \d+ failed in ", line):
            break
        result = line[lines[header].index("result") :][:4]
        if result in ("pass", "FAIL"):
            rows.append([line])
        else:
            rows[-1].append(line)
    return rows


def row_id(row: list[str], header: str) -> str:
    """A row's task id, its wrapped pieces joined."""
    return "".join(line[: header.index("result")].strip() for line in row)


def header_of(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("task "))


def failure_blocks(text: str) -> dict[str, list[str]]:
    """Each failure's block below the table: its id -> its lines (the header first)."""
    body = text.split(" failures:\n", 1)[1].splitlines()
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in body:
        if line.startswith("FAIL "):
            current = [line]
            blocks[line.removeprefix("FAIL ").rsplit("  (", 1)[0]] = current
        elif current and line.strip():
            current.append(line)
    return blocks


# -- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
def test_every_id_is_whole_and_no_line_is_wider_than_the_console(width: int) -> None:
    report = seventeen_task_report()
    text = render(report, width)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    assert [row_id(row, header_of(text)) for row in table_rows(text)] == [row.id for row in report.tasks]


@pytest.mark.parametrize("width", (100, 120, 160))
def test_a_passing_task_is_one_line_at_100_columns_or_more(width: int) -> None:
    passing_only = seventeen_task_report()
    passing_only.tasks = [row for row in passing_only.tasks if row.passed]
    rows = table_rows(render(passing_only, width))
    assert [len(row) for row in rows] == [1] * len(PASSING)  # the 73-character id included
    for row, task in zip(rows, passing_only.tasks, strict=True):  # the timings as one compact total
        assert row[0].rstrip().endswith(compact_seconds(task.timings_sec["total"]))
        assert "agent" not in row[0] and "verifier" not in row[0]
    # Beside failures, whose summaries take a column: every id of up to 40 characters keeps one line.
    mixed = table_rows(render(seventeen_task_report(), width))
    short = [
        row
        for row in mixed
        if "pass" in row[0] and len(row_id(row, header_of(render(seventeen_task_report(), width)))) <= 40
    ]
    assert len(short) == len(PASSING) - 1 and all(len(row) == 1 for row in short)


@pytest.mark.parametrize("width", (80, 120))
def test_a_long_task_id_is_wrapped_never_cut(width: int) -> None:
    report = seventeen_task_report()
    long_failing = "secure-archive-extraction-with-path-traversal-guards"
    text = render(report, width)
    by_id = {row_id(row, header_of(text)): row for row in table_rows(text)}
    assert LONG_ID in by_id and long_failing in by_id
    assert len(by_id[LONG_ID]) > 1  # wrapped: 73 characters do not fit beside the summaries
    assert "…" not in "".join(by_id[LONG_ID])
    # Each failure's block names its id whole on its first line.
    blocks = failure_blocks(text)
    assert blocks[long_failing][0].startswith(f"FAIL {long_failing}  (agent phase)")
    assert set(blocks) == {row.id for row in report.tasks if not row.passed}


@pytest.mark.parametrize("width", (80, 120))
def test_each_failure_reads_in_one_screen(width: int) -> None:
    report = seventeen_task_report()
    text = render(report, width)
    blocks = failure_blocks(text)
    for task_id, block in blocks.items():
        assert len(block) <= 1 + DETAIL_LINES, (task_id, len(block))
    table = text.split(" failures:\n", 1)[0].splitlines()
    assert len(table) <= 40 if width == 80 else len(table) <= 28  # 17 rows, a few wrapped
    # A summary line per failure in the table (at 80 columns little more than its phase); its
    # details below.
    rows = {row_id(row, header_of(text)): row for row in table_rows(text)}
    for row in report.tasks:
        if not row.passed:
            assert f"   {row.failed_phase[:6]}" in rows[row.id][0]
    # A long output keeps its end and says what it left out.
    extraction = blocks["secure-archive-extraction-with-path-traversal-guards"]
    assert "extracting member 039" in "".join(extraction)
    assert any("earlier lines left out: --json and --junit have them" in line for line in extraction)
    # The stand-in's note and the tail of pytest's output both fit.
    openssl = " ".join(line.strip() for line in blocks["openssl-selfsigned-cert"])
    assert STAND_IN in openssl and "1 failed, 3 passed" in openssl
    assert "python:3.13-slim-bookworm here is an offline stand-in: Debian 13 trixie" in openssl
    wide = render(report, 240)  # where no summary is cut, the table marks the stand-in too
    marked = {row_id(row, header_of(wide)): row[0] for row in table_rows(wide)}["openssl-selfsigned-cert"]
    assert marked.rstrip().endswith("verifier: reward 0 (expected 1) [stand-in base]")
    qemu = " ".join(blocks["qemu-startup"])
    assert "steps: fetch-image ok, boot FAIL, login FAIL" in qemu


def test_the_summary_column_is_one_line_per_failure() -> None:
    text = render(seventeen_task_report(), 120)
    rows = {row_id(row, header_of(text)): row for row in table_rows(text)}
    assert rows["write-compressor"][0].rstrip().endswith("verifier: reward ratio=0.4 (expected 1)")
    assert rows["sanitize-git-repo"][0].rstrip().endswith("…")  # cut, and whole in its block below
    assert "task: tests/test.sh is missing" in rows["workshop/day-2/regex-log-parser-with-unicode-normalisation"][0]


def test_control_characters_are_escaped_on_the_console() -> None:
    hostile = TaskValidation(
        id=HOSTILE_ID,
        passed=False,
        failed_phase="verifier",
        error="reward 0 (expected 1)\n--- verifier output (last lines) ---\nfound: /app/\x1b]0;pwned\x07.txt\n\x1b[1A\x1b[2Kok",
        steps=None,
        timings_sec={"total": 1.0},
    )
    report = ValidationReport(passed=0, failed=1, agent="oracle", environment="docker", wall_sec=1.0, tasks=[hostile])
    text = render(report, 100)
    assert UNSHOWABLE.search(text) is None
    assert "evil-\\x1b[2J-\\u202etxt.exe-\\x07" in text and "found: /app/\\x1b]0;pwned\\x07.txt" in text
    # Positive control: the same id printed as it is reaches the terminal raw.
    raw = io.StringIO()
    Console(file=raw, width=100, color_system=None).print(Text(HOSTILE_ID))
    assert UNSHOWABLE.search(raw.getvalue()) is not None


def test_printable_spells_out_everything_xml_forbids() -> None:
    every = "".join(map(chr, range(0x110000)))
    spelled = printable(every)
    ET.fromstring(f"<a>{spelled.replace('&', '&amp;').replace('<', '&lt;')}</a>")  # well-formed XML 1.0
    assert UNSHOWABLE.search(spelled) is None
    assert "\\x1b" in spelled and "\\x9b" in spelled and "\\ud800" in spelled and "\\u202e" in spelled
    assert printable("a\tb\nc") == "a\tb\nc" and printable("a\nb", newlines=False) == "a\\nb"


def test_log_lines_are_escaped() -> None:
    record = logging.LogRecord(
        "osmosis_harbor", logging.WARNING, __file__, 1, "dropped %r and %s", ("a\x1b[2J", "b\x1b]0;t\x07"), None
    )
    line = PrintableFormatter("%(message)s").format(record)
    assert line == "dropped 'a\\x1b[2J' and b\\x1b]0;t\\x07"
    assert UNSHOWABLE.search(logging.Formatter("%(message)s").format(record))  # the control: raw without it


# -- the reports CI reads ----------------------------------------------------------------------


def test_junit_message_is_the_summary_and_the_body_the_whole_error() -> None:
    report = seventeen_task_report()
    report.tasks.append(
        TaskValidation(
            id=HOSTILE_ID, passed=False, failed_phase="verifier", error="reward 0\n\x1b[2Jgone", timings_sec={}
        )
    )
    root = ET.fromstring(ET.tostring(junit_tree(report, suite_name="ds").getroot(), encoding="utf-8"))
    cases = {case.get("name"): case for case in root.iter("testcase")}
    openssl = cases["openssl-selfsigned-cert"].find("failure")
    assert openssl.get("message") == f"verifier: reward 0 (expected 1) ({STAND_IN})"
    assert openssl.text.startswith(report.tasks[10].error) and f"note: {STAND_IN}" in openssl.text
    assert '"stand_in": ' in openssl.text  # the JSON row too
    hostile = cases["evil-\\x1b[2J-\\u202etxt.exe-\\x07"].find("failure")
    assert hostile.get("message") == "verifier: reward 0" and "\\x1b[2Jgone" in hostile.text
    assert cases[PASSING[0]].find("failure") is None


def test_json_report_holds_any_dataset_name(tmp_path: Path) -> None:
    undecodable = "odd-\udcff-\x1b[2J"  # a directory name with a byte that is not UTF-8, as Python reads it
    report = ValidationReport(
        passed=0,
        failed=1,
        agent="oracle",
        environment="docker",
        wall_sec=0.1,
        tasks=[TaskValidation(id=undecodable, passed=False, failed_phase="task", error=f"task {undecodable}: bad")],
    )
    with pytest.raises(ValueError):  # the control: pydantic's own dump cannot write it
        report.model_dump_json()
    path = tmp_path / "r.json"
    path.write_text(report_json(report), encoding="utf-8")
    (row,) = json.loads(path.read_text(encoding="utf-8"))["tasks"]
    assert row["id"] == "odd-\\udcff-\x1b[2J"  # the surrogate spelled; the escape kept, JSON-escaped
    assert "\\u001b" in path.read_text() and json_safe({"k\udcff": ["\udcff"]}) == {"k\\udcff": ["\\udcff"]}


# -- what validate adds to failed rows ---------------------------------------------------------

STAND_IN_LABELS = {
    "python:3.13-slim-bookworm": {
        "osmosis-harbor.stand-in": "python:3.13-slim-bookworm",
        "osmosis-harbor.stand-in.really": "Debian 13 trixie, Python 3.13.5, OpenSSL 3.5.1",
    },
    "python:3.12-slim": {
        "osmosis-harbor.stand-in": "python:3.12-slim",
        "osmosis-harbor.stand-in.distribution": "debian/trixie",
    },
    "debian:trixie-slim": {"osmosis-harbor.stand-in": "debian:trixie-slim"},
    "python:3.11-slim": {"org.opencontainers.image.source": "https://example.invalid"},  # the real image
}


def test_what_stands_in_reads_the_labels() -> None:
    labels = STAND_IN_LABELS.get
    assert what_stands_in("python:3.13-slim-bookworm", labels) == "Debian 13 trixie, Python 3.13.5, OpenSSL 3.5.1"
    assert what_stands_in("python:3.13-slim-bookworm@sha256:" + "0" * 64, labels) is not None
    assert what_stands_in("python:3.12-slim", labels) == "Debian trixie"  # built before the label existed
    assert what_stands_in("debian:trixie-slim", labels) is None  # Debian itself: not the stand-in's doing
    assert what_stands_in("python:3.11-slim", labels) is None  # the real image
    assert what_stands_in("ubuntu:24.04", labels) is None  # absent
    note = stand_in_note(["python:3.13-slim-bookworm", "debian:trixie-slim", "python:3.13-slim-bookworm"], labels)
    assert note == (
        "python:3.13-slim-bookworm here is an offline stand-in: Debian 13 trixie, Python 3.13.5, OpenSSL 3.5.1 "
        "(no uv-managed Pythons offline; the real image may behave differently)"
    )


def _task(root: Path, name: str, dockerfile: str, toml_extra: str = "") -> TaskRef:
    (root / name / "environment").mkdir(parents=True)
    (root / name / "environment" / "Dockerfile").write_text(dockerfile)
    (root / name / "task.toml").write_text(f'schema_version = "1.4"\n[environment]\n{toml_extra}')
    return TaskRef(id=name, path=root / name)


def test_note_causes_notes_solution_and_verifier_failures_and_redacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-" + "s" * 40
    monkeypatch.setenv("REPORT_TEST_API_KEY", secret)
    tasks = [
        _task(tmp_path, "verifier-fails", "FROM python:3.13-slim-bookworm\n"),
        _task(tmp_path, "build-fails", "FROM python:3.13-slim-bookworm\nRUN false\n"),
        _task(tmp_path, "on-debian", "FROM debian:trixie-slim\n"),
        _task(tmp_path, "prebuilt", "FROM debian:trixie-slim\n", 'docker_image = "python:3.13-slim-bookworm"\n'),
    ]
    rows = [
        TaskValidation(id="verifier-fails", passed=False, failed_phase="verifier", error="reward 0 (expected 1)"),
        TaskValidation(
            id="build-fails", passed=False, failed_phase="environment", error=f"ImageBuildError: token {secret}"
        ),
        TaskValidation(id="on-debian", passed=False, failed_phase="agent", error="solve.sh exited with status 1"),
        TaskValidation(id="prebuilt", passed=False, failed_phase="verifier", error="reward 0 (expected 1)"),
    ]
    note_causes(rows, tasks, force_build=False, labels_of=STAND_IN_LABELS.get)
    assert [row.stand_in is not None for row in rows] == [True, False, False, True]
    assert rows[0].stand_in.startswith("python:3.13-slim-bookworm here is an offline stand-in")
    assert rows[1].error == "ImageBuildError: token ***"
    assert task_base_images(tasks[3].path, force_build=False) == ["python:3.13-slim-bookworm"]
    assert task_base_images(tasks[3].path, force_build=True) == ["debian:trixie-slim"]
