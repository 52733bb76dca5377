"""CI-friendly reports of ``validate``: JUnit XML, Harbor's lint findings, and kept trials as a
Harbor job directory that Harbor's own models and its ``harbor view`` server read back.

One real run over a mixed dataset (passing, failing, lint-flagged and oddly named tasks) feeds
most tests; ``--lint=strict`` gets a run of its own."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from harbor.models.job.config import JobConfig
from harbor.models.job.result import JobResult
from harbor.models.trial.result import TrialResult
from harbor.viewer.scanner import JobScanner
from harbor.viewer.server import create_app

from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.tasks.discovery import load_dataset
from osmosis_harbor.validate import TaskValidation, ValidationReport, validate_tasks
from osmosis_harbor.validate.junit import junit_tree
from osmosis_harbor.validate.lint import LintMode
from tests.support.common import FIXTURES, REPO, copy_task, load_json, run_cli
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

ODD_ID = 'build <fails> & "ünï"'  # markup characters, quotes and non-ASCII in a task id
CTL_ID = "ctl-\x1b[2J-\u202eid"  # a directory name with a clear-screen escape and a bidi override
CTL_SHOWN = "ctl-\\x1b[2J-\\u202eid"
ESC = "\x1b"


@dataclass(frozen=True)
class MixedRun:
    dataset: Path
    proc: subprocess.CompletedProcess[str]
    report: dict
    junit: Path
    job_dir: Path


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory: pytest.TempPathFactory) -> MixedRun:
    """``validate --lint --junit --json --trials-dir`` over two passing and three failing tasks."""
    tmp = tmp_path_factory.mktemp("mixed")
    dataset = tmp / "ds"
    for source in ("lint/clean", "lint/misspelled-field", "broken/solve-fails", "broken/bad-toml"):
        copy_task(FIXTURES / source, dataset / Path(source).name)
    copy_task(FIXTURES / "lint/clean", dataset / CTL_ID)
    odd = copy_task(FIXTURES / "lint/clean", dataset / ODD_ID)
    # The build error quotes the RUN line, raw escape byte included: text XML cannot carry.
    (odd / "environment" / "Dockerfile").write_text(
        f"FROM debian:trixie-slim\nRUN echo '{ESC}[31mred & <b>]]>' >&2; exit 1\n"
    )
    report, junit, job_dir = tmp / "report.json", tmp / "out" / "junit.xml", tmp / "jobs" / "run"
    proc = run_cli(
        "validate",
        str(dataset),
        "-n",
        "3",
        "--lint",
        "--junit",
        str(junit),
        "--json",
        str(report),
        "--trials-dir",
        str(job_dir),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return MixedRun(dataset, proc, load_json(report), junit, job_dir)


EXPECTED = {  # task id -> (passed, failed phase)
    "bad-toml": (False, "task"),
    "clean": (True, None),
    "misspelled-field": (True, None),
    "solve-fails": (False, "agent"),
    ODD_ID: (False, "environment"),
    CTL_ID: (True, None),
}


def test_mixed_run_verdicts(mixed_run: MixedRun) -> None:
    rows = {t["id"]: t for t in mixed_run.report["tasks"]}
    assert {k: (v["passed"], v["failed_phase"]) for k, v in rows.items()} == EXPECTED
    assert ESC in rows[ODD_ID]["error"]  # the JSON keeps what the build printed (JSON-escaped)


def test_control_characters_from_the_dataset_and_the_sandbox_are_escaped_on_the_console(mixed_run: MixedRun) -> None:
    out = mixed_run.proc.stdout + mixed_run.proc.stderr
    assert ESC not in out and "\u202e" not in out
    assert CTL_SHOWN in mixed_run.proc.stdout  # the id, spelled out, in the table
    assert "\\x1b[31mred & <b>]]>" in mixed_run.proc.stdout  # the build's output, in the failure's block
    cases = {c.get("name") for c in ET.parse(mixed_run.junit).getroot().iter("testcase")}
    assert CTL_SHOWN in cases


# -- JUnit -------------------------------------------------------------------------------------

# The shape CI tools read (Ant/Jenkins JUnit schema): element -> (required attributes, optional
# attributes, allowed children).
JUNIT_SHAPE = {
    "testsuites": (set(), {"name", "tests", "failures", "errors", "skipped", "time", "disabled"}, {"testsuite"}),
    "testsuite": (
        {"name", "tests"},
        {"failures", "errors", "skipped", "time", "timestamp", "hostname", "id", "package", "disabled", "file"},
        {"properties", "testcase", "system-out", "system-err"},
    ),
    "properties": (set(), set(), {"property"}),
    "property": ({"name", "value"}, set(), set()),
    "testcase": (
        {"name"},
        {"classname", "time", "assertions", "status", "file", "line"},
        {"skipped", "error", "failure", "system-out", "system-err"},
    ),
    "failure": (set(), {"message", "type"}, set()),
    "system-out": (set(), set(), set()),
}
_COUNT = re.compile(r"\d+")
_TIME = re.compile(r"\d+(\.\d+)?")


def assert_junit_shape(element: ET.Element) -> None:
    required, optional, children = JUNIT_SHAPE[element.tag]
    assert required <= set(element.attrib) <= required | optional, (element.tag, element.attrib)
    for name in {"tests", "failures", "errors", "skipped"} & set(element.attrib):
        assert _COUNT.fullmatch(element.get(name)), (element.tag, name)
    if "time" in element.attrib:
        assert _TIME.fullmatch(element.get("time")), element.attrib
    if "timestamp" in element.attrib:
        datetime.fromisoformat(element.get("timestamp"))
    for child in element:
        assert child.tag in children, (element.tag, child.tag)
        assert_junit_shape(child)
    if element.tag == "testsuite":
        cases = element.findall("testcase")
        assert int(element.get("tests")) == len(cases)
        assert int(element.get("failures")) == sum(len(c.findall("failure")) for c in cases)
        assert int(element.get("errors")) == sum(len(c.findall("error")) for c in cases)


def test_junit_report_has_a_testcase_per_task_and_failures_with_their_phase(mixed_run: MixedRun) -> None:
    root = ET.parse(mixed_run.junit).getroot()
    assert root.tag == "testsuites"
    assert_junit_shape(root)
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == str(mixed_run.dataset)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "6",
        "3",
        "0",
        "0",
    )
    assert float(suite.get("time")) == pytest.approx(mixed_run.report["wall_sec"], abs=1e-3)
    assert {p.get("name"): p.get("value") for p in suite.iter("property")} == {
        "agent": "oracle",
        "environment": "docker",
    }
    rows = {t["id"]: t for t in mixed_run.report["tasks"]}
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {CTL_SHOWN if i == CTL_ID else i for i in EXPECTED}  # markup and quotes come back exactly
    for task_id, case in cases.items():
        row = rows[CTL_ID if task_id == CTL_SHOWN else task_id]
        assert case.get("classname") == str(mixed_run.dataset)
        assert float(case.get("time")) == pytest.approx(row["timings_sec"].get("total", 0.0), abs=1e-3)
        out = case.find("system-out").text
        for phase, seconds in row["timings_sec"].items():
            assert f"{phase} {seconds:.3f}s" in out
        failure = case.find("failure")
        if row["passed"]:
            assert failure is None
            continue
        assert failure.get("type") == row["failed_phase"]
        # The message is the one-line summary; the body the whole error, then the JSON row.
        summary = row["error"].split("\n", 1)[0].replace(ESC, "\\x1b")
        assert failure.get("message") == f"{row['failed_phase']}: {summary}"
        assert failure.text.startswith(row["error"].replace(ESC, "\\x1b"))
        assert "verifier" not in row["timings_sec"] or '"verifier"' in failure.text
    solve = cases["solve-fails"].find("failure")
    assert solve.get("message") == "agent: solve.sh exited with status 3"
    assert "solve-fails fixture: this message goes to stderr" in solve.text  # solve.sh's own output
    assert '"reward": 0.0' in solve.text and '"total":' in solve.text
    odd = cases[ODD_ID].find("failure")
    assert odd.get("message").startswith("environment: ") and ESC not in odd.get("message") + odd.text
    assert "\\x1b[31mred & <b>]]>" in odd.text


def test_junit_spells_out_what_xml_cannot_hold() -> None:
    hostile = "<a & b> \"q\" 'ü' \x00\x07\x1b[0m \ud800 ]]>"
    report = ValidationReport(
        passed=0,
        failed=1,
        agent="oracle",
        environment="docker",
        wall_sec=1.5,
        tasks=[
            TaskValidation(
                id=hostile, passed=False, failed_phase="verifier", error=hostile, timings_sec={"total": 1.0}
            ),
        ],
    )
    data = ET.tostring(junit_tree(report, suite_name=hostile).getroot(), encoding="utf-8")
    case = ET.fromstring(data).find("testsuite/testcase")  # a parser accepts it
    spelled = "<a & b> \"q\" 'ü' \\x00\\x07\\x1b[0m \\ud800 ]]>"
    assert case.get("name") == case.get("classname") == spelled
    assert case.find("failure").get("message") == f"verifier: {spelled}"
    assert case.find("failure").text.startswith(spelled)


# -- Harbor's lint -----------------------------------------------------------------------------


def column_text(table: str, header: str) -> str:
    """The text of one column of a rendered rich table with borders (the lint table), its folded
    lines joined."""
    lines = table.splitlines()
    heads = [cell.strip() for cell in next(line for line in lines if "┃" in line).split("┃")]
    index = heads.index(header)
    return " ".join(line.split("│")[index].strip() for line in lines if line.startswith("│")).strip()


def test_lint_findings_are_in_the_json_and_the_table_and_every_task_still_runs(mixed_run: MixedRun) -> None:
    rows = {t["id"]: t for t in mixed_run.report["tasks"]}
    assert rows["clean"]["lint"] == []
    findings = {(f["rule"], f["severity"], f["path"]) for f in rows["misspelled-field"]["lint"]}
    assert findings == {("unknown-config-field", "error", "task.toml"), ("shared-verifier", "warning", "task.toml")}
    assert any("timeout_secs" in f["message"] for f in rows["misspelled-field"]["lint"])
    assert rows["misspelled-field"]["passed"] and rows["misspelled-field"]["reward"] == 1.0  # not strict: it ran
    assert ("invalid-task-config", "error") in {(f["rule"], f["severity"]) for f in rows["bad-toml"]["lint"]}
    results, lint = mixed_run.proc.stdout.split("Lint (harbor lint rules)")
    assert "Unknown field" not in results  # findings stay out of the results and the failures
    row = next(line for line in results.splitlines() if line.startswith("misspelled-field "))
    assert "1E 1W" in row
    assert "Unknown field 'verifier.timeout_secs'" in column_text(lint, "message")
    assert "unknown-config-field" in column_text(lint, "rule")


def test_a_passing_tasks_lint_findings_reach_junit(mixed_run: MixedRun) -> None:
    cases = {c.get("name"): c for c in ET.parse(mixed_run.junit).getroot().iter("testcase")}
    passing = cases["misspelled-field"]
    assert passing.find("failure") is None
    out = passing.find("system-out").text
    assert "lint error [unknown-config-field] task.toml: Unknown field 'verifier.timeout_secs'" in out
    assert "lint warning [shared-verifier] task.toml: " in out


async def test_strict_lint_refuses_tasks_with_lint_errors_before_any_sandbox() -> None:
    tasks = load_dataset(FIXTURES / "lint")
    report = await validate_tasks(
        tasks, environment=environment_config("docker"), lint=LintMode.STRICT, keep_trials=True
    )
    job_dir = Path(report.job_dir)
    try:
        rows = {r.id: r for r in report.tasks}
        assert rows["clean"].passed and rows["clean"].lint == []
        refused = rows["misspelled-field"]
        assert (refused.passed, refused.failed_phase, refused.timings_sec) == (False, "task", {})
        assert refused.error.startswith(
            "task misspelled-field: harbor lint error unknown-config-field in "
            "task.toml: Unknown field 'verifier.timeout_secs'"
        )
        assert {f.rule for f in refused.lint} == {"unknown-config-field", "shared-verifier"}
        # Only the clean task became a trial; the kept temp dir holds just this job.
        assert JobScanner(job_dir.parent).list_jobs() == [job_dir.name]
        assert [d.name.split("__")[0] for d in job_dir.iterdir() if d.is_dir()] == ["clean"]
    finally:
        shutil.rmtree(job_dir.parent)


# -- kept trials as a Harbor job ---------------------------------------------------------------


def test_kept_trials_are_a_harbor_job_that_harbor_reads_back(mixed_run: MixedRun) -> None:
    job_dir = mixed_run.job_dir
    assert f"trials kept in {job_dir}" in mixed_run.proc.stdout
    assert f"harbor view {job_dir.parent}" in mixed_run.proc.stdout
    assert mixed_run.report["job_dir"] == str(job_dir)
    config = JobConfig.model_validate_json((job_dir / "config.json").read_text())
    result = JobResult.model_validate_json((job_dir / "result.json").read_text())
    trials = {
        d.name: TrialResult.model_validate_json((d / "result.json").read_text())
        for d in job_dir.iterdir()
        if (d / "result.json").is_file()
    }
    rows = {t["id"]: t for t in mixed_run.report["tasks"]}
    ran = {task_id for task_id, (_, phase) in EXPECTED.items() if phase != "task"}

    assert (config.job_name, config.jobs_dir) == (job_dir.name, job_dir.parent)
    assert [a.name for a in config.agents] == ["oracle"] and config.environment.kwargs["sdk"] == "docker"
    assert {t.path.name for t in config.tasks} == ran
    by_task = {t.task_name: t for t in trials.values()}
    assert set(by_task) == ran and len(trials) == len(ran)
    for task_id in ("clean", "misspelled-field", "solve-fails"):
        trial = by_task[task_id]
        assert trial.verifier_result.rewards == {"reward": rows[task_id]["reward"]}
        assert str(job_dir / trial.trial_name) == rows[task_id]["trial_dir"]
    assert by_task[ODD_ID].verifier_result is None
    assert by_task[ODD_ID].exception_info.exception_type == "ImageBuildError"
    assert result.n_total_trials == len(ran) and result.finished_at is not None
    assert (result.stats.n_completed_trials, result.stats.n_errored_trials) == (len(ran), 1)
    evals = result.stats.evals["oracle__adhoc"]
    assert {k: sorted(v) for k, v in evals.reward_stats["reward"].items()} == {
        1.0: sorted([by_task[t].trial_name for t in ("clean", "misspelled-field", CTL_ID)]),
        0.0: [by_task["solve-fails"].trial_name],
    }
    assert evals.exception_stats == {"ImageBuildError": [by_task[ODD_ID].trial_name]}
    assert evals.metrics == [{"mean": 0.6}]  # Harbor's mean: 3 of 5 trials scored 1 (no reward counts 0)

    # What `harbor view` serves for this directory.
    viewer = TestClient(create_app(job_dir.parent))
    (job,) = viewer.get("/api/jobs").json()["items"]
    assert (job["name"], job["n_total_trials"], job["agents"]) == (job_dir.name, len(ran), ["oracle"])
    listed = viewer.get(f"/api/jobs/{job_dir.name}/trials").json()["items"]
    assert {t["name"]: (t["task_name"], t["reward"], t["error_type"]) for t in listed} == {
        name: (t.task_name, rows[t.task_name]["reward"], "ImageBuildError" if t.task_name == ODD_ID else None)
        for name, t in trials.items()
    }


# -- a report a person reads, on both SDKs -----------------------------------------------------

REPORTS = FIXTURES / "reports"
STAND_IN_TASK = "openssl-bookworm-release"
NAMES_TASK = "control-characters-in-names"
LONG_ID = "terminal-bench-style/a-passing-task-whose-id-is-long-enough-to-wrap-at-eighty-columns"
_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def bookworm_stand_in() -> str:
    """The stand-in the stand-in task builds FROM, made by the command the report advises."""
    proc = subprocess.run(
        [sys.executable, "-m", "osmosis_harbor", "base-images", "python:3.13-slim-bookworm"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    return "python:3.13-slim-bookworm"


def _failure_blocks(stdout: str) -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stdout.split(" failures:\n", 1)[1].splitlines():
        if line.startswith("FAIL "):
            current = [line]
            blocks[line.removeprefix("FAIL ").rsplit("  (", 1)[0]] = current
        elif current and line.strip():
            current.append(line)
    return blocks


@pytest.mark.slow
@DOCKER_PATH_ONLY
def test_a_report_a_person_reads_at_80_columns(tmp_path: Path, sandbox_sdk: SdkPath, bookworm_stand_in: str) -> None:
    """A stand-in-caused failure, a failure whose output holds control characters, and a passing
    task with a long id, validated as a user would at 80 columns: each id whole, each failure in
    a screen, the stand-in named in the table, the JSON and JUnit, nothing raw on the console."""
    report_path, junit_path = tmp_path / "r.json", tmp_path / "j.xml"
    proc = run_cli(
        *("validate", str(REPORTS), "--env", sandbox_sdk.name, "-n", "3", "--json", str(report_path)),
        *("--junit", str(junit_path)),
        env={"COLUMNS": "80", **sandbox_sdk.cli_env()},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not sandbox_sdk.sandboxes_left()
    rows = {row["id"]: row for row in load_json(report_path)["tasks"]}
    assert {k: (v["passed"], v["failed_phase"]) for k, v in rows.items()} == {
        STAND_IN_TASK: (False, "verifier"),
        NAMES_TASK: (False, "verifier"),
        LONG_ID: (True, None),
    }

    # The stand-in, named where the failure is: JSON, the failure's block, JUnit.
    note = rows[STAND_IN_TASK]["stand_in"]
    assert note.startswith(f"{bookworm_stand_in} here is an offline stand-in: Debian 13 trixie, Python 3.13")
    assert "OpenSSL 3." in note and rows[NAMES_TASK]["stand_in"] is None  # debian:trixie-slim is Debian
    assert "expected Debian bookworm, found trixie" in rows[STAND_IN_TASK]["error"]  # the positive control
    blocks = _failure_blocks(proc.stdout)
    assert set(blocks) == {STAND_IN_TASK, NAMES_TASK}
    assert note in " ".join(line.strip() for line in blocks[STAND_IN_TASK])
    cases = {case.get("name"): case for case in ET.parse(junit_path).getroot().iter("testcase")}
    failure = cases[STAND_IN_TASK].find("failure")
    assert failure.get("message") == f"verifier: reward 0 (expected 1) ({note})"

    # Package-manager progress out of the tail, the tests' own lines in.
    error = rows[STAND_IN_TASK]["error"]
    assert "[27 package-manager progress lines left out]" in error and "Get:1 " not in error
    assert "FAILED test_openssl_is_3_0 - AssertionError: expected OpenSSL 3.0.x" in error

    # Control characters: raw in the JSON (JSON-escaped), spelled out on the console and in JUnit.
    assert "\x1b[2J" in rows[NAMES_TASK]["error"] and "\u202e" in rows[NAMES_TASK]["error"]
    assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout and "\x07" not in proc.stdout
    assert "found: /app/report-\\x1b[2J-clear.txt" in proc.stdout
    assert "\\x1b]0;pwned\\x07" in cases[NAMES_TASK].find("failure").text

    # Every id whole (the long one wrapped in the table), no line past 80, a screen per failure.
    lines = proc.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    header = next(line for line in lines if line.startswith("task "))
    width = header.index("result")
    start = next(i for i, line in enumerate(lines) if line.startswith("terminal-bench-style/"))
    pieces = [lines[start][:width].strip()]
    for line in lines[start + 1 :]:
        if line[width:].strip():
            break
        pieces.append(line[:width].strip())
    assert "".join(pieces) == LONG_ID and len(pieces) > 1
    assert all(len(block) <= 21 for block in blocks.values()), blocks


def _no_sandbox_dataset(root: Path) -> tuple[Path, str]:
    """Two tasks that fail in phase ``task`` (no sandbox): one with a long summary, one whose
    directory name holds bytes that are not UTF-8; returns the dataset and the second's id."""
    copy_task(FIXTURES / "broken" / "bad-toml", root / "a-task-with-a-malformed-task-toml")
    # Bytes that are not UTF-8 in a directory name reach Python as lone surrogates, which
    # Harbor's JSON files (and ours) cannot hold.
    copy_task(FIXTURES / "lint" / "clean", Path(os.fsdecode(bytes(root) + b"/odd-\xff-name")))
    return root, "odd-\\udcff-name"


def _widest_line(output: str) -> int:
    return max(len(_CSI.sub("", line).rstrip()) for line in output.splitlines() if line.strip())


def test_the_table_takes_the_terminals_width_and_a_path_that_is_not_utf8_fails_its_task(tmp_path: Path) -> None:
    """One run on a terminal 90 columns wide: the table takes its width; and the task whose path
    is not UTF-8 fails in phase ``task``, named escaped, in every report (the console, the JSON,
    JUnit)."""
    dataset, odd = _no_sandbox_dataset(tmp_path / "ds")
    report_path, junit_path = tmp_path / "r.json", tmp_path / "j.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 90, 0, 0))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "osmosis_harbor", "validate", str(dataset)]
            + ["--json", str(report_path), "--junit", str(junit_path)],
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            env={**env, "NO_COLOR": "1"},
            cwd=REPO,
        )
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=120) == 1
    finally:
        os.close(primary)
    on_terminal = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert _widest_line(on_terminal) == 90, on_terminal
    # Off a terminal ($COLUMNS when set, else 120, not Rich's 80): tests/unit/cli/test_result_width.py.

    rows = {row["id"]: row for row in load_json(report_path)["tasks"]}
    assert set(rows) == {"a-task-with-a-malformed-task-toml", odd}
    assert rows[odd]["failed_phase"] == "task"
    assert rows[odd]["error"].endswith("its path is not UTF-8 (Harbor records it in JSON files): rename it")
    assert f"FAIL {odd}  (task phase)" in _CSI.sub("", on_terminal), on_terminal
    cases = [case.get("name") for case in ET.parse(junit_path).getroot().iter("testcase")]
    assert sorted(cases) == sorted(rows)
