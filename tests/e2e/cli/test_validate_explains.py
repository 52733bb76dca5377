"""Validation that says why: a missing base image named with its remedy and
not retried, the tail of the verifier's and ``solve.sh``'s output kept in the row, the JSON and
the JUnit failure (key redacted), a verifier that never ran its tests failing under oracle and
nop, and lint findings out of the error column and into JUnit.

The end-to-end runs use ``tests/fixtures/explain`` (see its README) through the real command
line and real Docker builds and sandboxes; the readers of sandbox-written files get their
hostile cases (FIFO, symlink, huge file) directly.
"""

from __future__ import annotations

import os
import threading
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.environment import images as sandbox_environment
from osmosis_harbor.sandbox.images.base_images import base_images, missing_base_error
from osmosis_harbor.sandbox.images.stand_ins import offline_recipes
from osmosis_harbor.tasks.discovery import load_dataset
from osmosis_harbor.trials.evidence import TAIL_BYTES, output_tail, runner_never_started
from osmosis_harbor.trials.progress_lines import without_progress
from osmosis_harbor.validate import validate_tasks
from tests.support.common import FIXTURES, load_json, run_cli

EXPLAIN = FIXTURES / "explain"
KEY_VAR = "FIXTURE_API_KEY"


@dataclass
class Run:
    rows: dict[str, dict]
    junit: ET.Element
    stdout: str
    key: str


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("explain")
    key = f"sk-fixture-{uuid.uuid4().hex}"
    report, junit = tmp / "r.json", tmp / "j.xml"
    proc = run_cli(
        "validate",
        str(EXPLAIN),
        "-n",
        "3",
        "--lint",
        "--json",
        str(report),
        "--junit",
        str(junit),
        env={KEY_VAR: key, "COLUMNS": "200"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {t["id"]: t for t in load_json(report)["tasks"]}
    return Run(rows, ET.parse(junit).getroot(), proc.stdout, key)


@pytest.mark.slow
def test_a_missing_base_image_is_named_with_its_remedy(oracle_run: Run) -> None:
    absent = oracle_run.rows["missing-base"]
    assert (absent["passed"], absent["failed_phase"]) == (False, "environment")
    assert absent["error"] == (
        "BaseImageMissingError: base image ubuntu:26.04 is not present and cannot be pulled; "
        "no offline recipe (python -m osmosis_harbor base-images --list); provide the image itself (docker load)"
    )
    pinned = oracle_run.rows["missing-base-digest"]
    assert pinned["failed_phase"] == "environment"
    assert "base image python:3.12-slim@sha256:000000000000… is not present and cannot be pulled" in pinned["error"]
    # The stand-in of the unpinned name is present, so the advice is to drop the digest, not a
    # command that would do nothing.
    assert (
        "pinned by digest, which no offline stand-in can match: drop the digest (FROM python:3.12-slim uses the stand-in present here) or provide the image itself (docker load)"
        in pinned["error"]
    )
    for row in (absent, pinned):
        assert "registry-1.docker.io" not in row["error"] and "no such host" not in row["error"]


@pytest.mark.slow
def test_failures_carry_the_tail_of_their_output(oracle_run: Run) -> None:
    failing = oracle_run.rows["assertion-fails"]
    assert failing["failed_phase"] == "verifier" and failing["error"].startswith("reward 0 (expected 1)\n")
    assert "AssertionError: expected /app/answer.txt to hold 42, found '41'" in failing["error"]
    # The key reached the verifier's output (the positive control) and left it redacted (Harbor
    # scrubs the verifier's env values itself; other host secrets: test_output_tail_is_bounded...).
    assert "calling the judge with key [REDACTED]" in failing["error"]
    solve = oracle_run.rows["solve-fails"]
    assert solve["failed_phase"] == "agent" and solve["error"].startswith("solve.sh exited with status 4\n")
    assert "solve-fails: computing the answer" in solve["error"]
    assert "solve-fails: cannot reach the answer service" in solve["error"]  # stderr too

    cases = {case.get("name"): case for case in oracle_run.junit.iter("testcase")}
    for task_id in ("assertion-fails", "solve-fails", "runner-missing"):
        body = cases[task_id].find("failure").text
        assert oracle_run.rows[task_id]["error"] in body, body
    dumped = ET.tostring(oracle_run.junit, encoding="unicode")
    assert oracle_run.key not in dumped and oracle_run.key not in oracle_run.stdout
    assert oracle_run.key not in repr(oracle_run.rows)


@pytest.mark.slow
def test_a_verifier_that_never_ran_its_tests_fails_under_oracle(oracle_run: Run) -> None:
    row = oracle_run.rows["runner-missing"]
    assert (row["passed"], row["failed_phase"], row["reward"]) == (False, "verifier", 0.0)
    assert row["error"].startswith("verifier did not run its tests (/tests/test.sh: line 5: pytest: command not found)")


@pytest.mark.slow
def test_nop_fails_a_verifier_that_never_ran_and_passes_one_whose_tests_fail(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    proc = run_cli(
        "validate",
        str(EXPLAIN),
        "--agent",
        "nop",
        "--task",
        "runner-missing",
        "--task",
        "assertion-fails",
        "--json",
        str(report),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {t["id"]: t for t in load_json(report)["tasks"]}
    broken = rows["runner-missing"]
    assert (broken["passed"], broken["reward"], broken["failed_phase"]) == (False, 0.0, "verifier")
    assert broken["error"].startswith("verifier did not run its tests")
    # Positive control: tests that ran and failed on an untouched sandbox are what nop wants.
    assert rows["assertion-fails"]["passed"] and rows["assertion-fails"]["reward"] == 0.0


@pytest.mark.slow
def test_lint_is_a_column_a_table_and_junit_output(oracle_run: Run) -> None:
    table = oracle_run.stdout.split("Lint (harbor lint rules)")
    assert len(table) == 2, oracle_run.stdout
    results, lint = table
    assert "shared-verifier" not in results and "1W" in results  # counts only, beside the error
    assert lint.count("shared-verifier") == 1 and 'environment_mode = "separate"' in lint
    for case in oracle_run.junit.iter("testcase"):
        assert "lint warning [shared-verifier] task.toml: the verifier runs" in case.find("system-out").text


@pytest.mark.slow
async def test_a_missing_base_is_built_once_and_another_build_failure_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: dict[str, int] = {}
    lock = threading.Lock()
    real = sandbox_environment.build_image

    def counting(context_dir: Path, dockerfile: Path, ref: str, platform: str | None) -> None:
        with lock:
            task = context_dir.parent.name
            calls[task] = calls.get(task, 0) + 1
        real(context_dir, dockerfile, ref, platform)

    monkeypatch.setattr(sandbox_environment, "build_image", counting)
    tasks = load_dataset(EXPLAIN, ["missing-base"]) + load_dataset(FIXTURES / "broken", ["build-fails"])
    report = await validate_tasks(tasks, environment=environment_config("docker"), n_concurrent=2)
    rows = {r.id: r for r in report.tasks}
    assert rows["missing-base"].error.startswith("BaseImageMissingError: base image ubuntu:26.04")
    head, *detail = rows["build-fails"].error.splitlines()
    assert head.startswith("ImageBuildError: docker build failed for") and head.endswith("exit code 1")
    assert "at step 2/3 (RUN echo" in head and "build-fails fixture: this build fails on purpose" in detail
    assert calls == {"missing-base": 1, "build-fails": 2}  # the retry is real, and skipped for a missing base


# -- the readers of sandbox-written files, on their own -----------------------------------------


def test_output_tail_is_bounded_and_redacted(tmp_path: Path) -> None:
    key = "sk-" + "k" * 40
    log = tmp_path / "test-stdout.txt"
    log.write_text("".join(f"line {i}\n" for i in range(5000)) + f"key {key}\n" + "last line\n")
    tail = output_tail(log, [key])
    assert tail is not None and tail.splitlines()[-2:] == ["key ***", "last line"]
    assert len(tail.splitlines()) == 20 and len(tail.encode()) <= TAIL_BYTES
    log.write_text("x" * 100_000 + key[:-5])  # one long line, ending in part of the key
    assert len(output_tail(log, [key]).encode()) <= TAIL_BYTES
    assert output_tail(tmp_path / "absent.txt") is None


def test_output_tail_never_follows_a_link_or_blocks_on_a_fifo(tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("host secret\n")
    os.chmod(canary, 0o600)
    link = tmp_path / "test-stdout.txt"
    link.symlink_to(canary)
    assert canary.read_text() == "host secret\n"  # positive control: the link does reach it
    assert output_tail(link) is None
    link.unlink()
    os.mkfifo(link)  # no writer: an ordinary open would block forever
    assert output_tail(link) is None
    assert runner_never_started(tmp_path, {"reward": 0.0}) is None


def test_the_did_not_run_rule(tmp_path: Path) -> None:
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    out = verifier / "test-stdout.txt"
    out.write_text("+ uvx -p 3.12 pytest\nerror: No interpreter found for Python 3.12 in managed installations\n")
    assert runner_never_started(verifier, {"reward": 0.0}) == (
        "error: No interpreter found for Python 3.12 in managed installations"
    )
    assert runner_never_started(verifier, {"reward": 1.0}) is None  # a reward above 0 came from somewhere
    out.write_text("bash: curl: command not found\n===== test session starts =====\ncollected 3 items\n")
    assert runner_never_started(verifier, {"reward": 0.0}) is None  # the runner started after all
    out.write_text("/tests/test.sh: line 3: pytest: command not found\n")
    (verifier / "ctrf.json").write_text("{}")
    assert runner_never_started(verifier, {}) is None  # a test report says they ran
    (verifier / "ctrf.json").unlink()
    assert runner_never_started(verifier, {}) == "/tests/test.sh: line 3: pytest: command not found"


def test_base_images_of_a_dockerfile() -> None:
    dockerfile = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.12-slim\n"
        "ARG OPEN\n"
        "FROM --platform=linux/amd64 ${BASE} AS build\n"
        "RUN echo \\\n  hi\n"
        "FROM build AS test\n"
        "FROM $OPEN\n"
        "FROM scratch\n"
        "from ubuntu:26.04@sha256:" + "ab" * 32 + "\n"
        "COPY --from=build /x /x\n"
    )
    assert base_images(dockerfile) == ["python:3.12-slim", "ubuntu:26.04@sha256:" + "ab" * 32]


def test_offline_recipes_come_from_the_script(tmp_path: Path) -> None:
    recipes = offline_recipes()
    assert recipes is not None and {"ubuntu:24.04", "python:3.12-slim", "debian:trixie-slim"} <= recipes
    assert "ubuntu:26.04" not in recipes
    assert offline_recipes(tmp_path / "base-images.sh") is None  # no script here: said so, not guessed


@pytest.mark.parametrize(
    ("present", "remedy"),
    [
        (
            {"python:3.12-slim"},
            "drop the digest (FROM python:3.12-slim uses the stand-in present here) or provide the image itself (docker load)",
        ),
        (
            set(),
            "drop the digest and make the stand-in (python -m osmosis_harbor base-images python:3.12-slim), "
            "or provide the image itself (docker load)",
        ),
    ],
)
def test_a_digest_pin_is_advised_to_drop_the_digest(tmp_path: Path, present: set[str], remedy: str) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM python:3.12-slim@sha256:" + "0" * 64 + "\n")
    error = missing_base_error(dockerfile, "env:1", present.__contains__, "pull access denied")
    assert error is not None
    assert str(error).split("\n")[0].endswith(f"pinned by digest, which no offline stand-in can match: {remedy}")
    dockerfile.write_text("FROM ubuntu:26.04@sha256:" + "0" * 64 + "\n")  # no recipe for the name either
    assert "provide the image itself (docker load) (ubuntu:26.04 has no offline recipe either: " in str(
        missing_base_error(dockerfile, "env:1", present.__contains__, "")
    )


# Progress as Terminal-Bench style verifiers print it: apt installing curl, uv's installer, uvx
# installing pytest, pip, curl's meter; and the lines that explain a failure, which stay.
NOISY_OUTPUT = """Hit:1 http://deb.debian.org/debian trixie InRelease
Get:2 http://deb.debian.org/debian trixie-updates InRelease [47.3 kB]
Fetched 90.7 kB in 0s (312 kB/s)
Reading package lists...
The following NEW packages will be installed:
  curl libcurl4t64
0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.
Need to get 1,234 kB of archives.
debconf: delaying package configuration, since apt-utils is not installed
Selecting previously unselected package curl.
(Reading database ... 6543 files and directories currently installed.)
Preparing to unpack .../curl_8.14.1-2_amd64.deb ...
Unpacking curl (8.14.1-2) ...
Setting up curl (8.14.1-2) ...
Err:3 http://deb.debian.org/debian trixie/main amd64 libfoo amd64 1.0
E: Unable to locate package libdoesnotexist
  % Total    % Received % Xferd  Average Speed   Time    Time     Time  Current
                                 Dload  Upload   Total   Spent    Left  Speed
  0     0    0     0    0     0      0      0 --:--:-- --:--:-- --:--:--     0
curl: (6) Could not resolve host: astral.sh
Collecting pytest==8.4.1
  Downloading pytest-8.4.1-py3-none-any.whl (365 kB)
     ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 365.5/365.5 kB 2.1 MB/s eta 0:00:00
Installing collected packages: iniconfig, pytest
Successfully installed iniconfig-2.1.0 pytest-8.4.1
Building wheel for numpy (pyproject.toml) ... error
Resolved 6 packages in 152ms
Downloading pygments (1.2MiB)
 Downloaded pygments
Installed 6 packages in 12ms
 + pytest==8.4.1
error: Failed to download `pytest==8.4.1`
50%\r75%\r100% downloaded
=================== 1 failed, 2 passed in 0.31s ===================
"""


def test_progress_lines_are_left_out_and_errors_stay() -> None:
    kept = list(without_progress(NOISY_OUTPUT.rstrip("\n").split("\n")))  # a lone \r is a redraw, not a line end
    assert kept == [
        "[14 package-manager progress lines left out]",
        "Err:3 http://deb.debian.org/debian trixie/main amd64 libfoo amd64 1.0",
        "E: Unable to locate package libdoesnotexist",
        "[3 package-manager progress lines left out]",
        "curl: (6) Could not resolve host: astral.sh",
        "[5 package-manager progress lines left out]",
        "Building wheel for numpy (pyproject.toml) ... error",
        "[5 package-manager progress lines left out]",
        "error: Failed to download `pytest==8.4.1`",
        "100% downloaded",  # what a terminal showed of a line redrawn with carriage returns
        "=================== 1 failed, 2 passed in 0.31s ===================",
    ]


def test_a_tail_drops_progress_and_the_did_not_run_rule_reads_it_all(tmp_path: Path) -> None:
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    out = verifier / "test-stdout.txt"
    progress = "".join(
        f"Get:{i} http://deb.debian.org/debian trixie/main amd64 lib{i} amd64 1.0 [9 kB]\n" for i in range(200)
    )
    out.write_text(progress + "error: No interpreter found for Python 3.12 in managed installations\n")
    tail = output_tail(out)
    assert (
        tail
        == "[200 package-manager progress lines left out]\nerror: No interpreter found for Python 3.12 in managed installations"
    )
    raw = output_tail(out, drop_progress=False)  # the control: without the filter, progress is all it shows
    assert raw is not None and raw.count("Get:") == 19
    assert (
        runner_never_started(verifier, {"reward": 0.0})
        == "error: No interpreter found for Python 3.12 in managed installations"
    )
