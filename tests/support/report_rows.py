"""A 17-task validation report as a real public dataset gives one (Terminal-Bench style ids,
cookbook recipes under a folder, failures with the tails such tasks print), built as rows so
the rendering tests need no sandbox. The ids and outputs are this project's own."""

from __future__ import annotations

from osmosis_harbor.trials.verdict import StepVerdict
from osmosis_harbor.validate import TaskValidation, ValidationReport

LONG_ID = "cookbook/recipes/aero-composite-delamination-surrogate-model-calibration"
STAND_IN = (
    "python:3.13-slim-bookworm here is an offline stand-in: Debian 13 trixie, Python 3.13.5, OpenSSL 3.5.1 "
    "(no uv-managed Pythons offline; the real image may behave differently)"
)
APT_NOISE = [
    f"Get:{i} http://deb.debian.org/debian trixie/main amd64 lib{i} amd64 1.{i}-1 [{i * 7} kB]" for i in range(1, 30)
]
PYTEST_TAIL = [
    "============================= test session starts ==============================",
    "collected 4 items",
    "",
    "../tests/test_outputs.py ..F.                                            [100%]",
    "=================================== FAILURES ===================================",
    "____________________________ test_certificate_subject ___________________________",
    "    def test_certificate_subject():",
    "        out = subprocess.run(['openssl', 'x509', '-in', CERT, '-noout', '-subject'], capture_output=True, text=True).stdout",
    ">       assert out.strip() == 'subject=CN = dev.internal, O = Harbor Test'",
    "E       AssertionError: assert 'subject=CN=dev.internal, O=Harbor Test' == 'subject=CN = dev.internal, O = Harbor Test'",
    "=========================== short test summary info ============================",
    "FAILED ../tests/test_outputs.py::test_certificate_subject - AssertionError",
    "========================= 1 failed, 3 passed in 0.42s ==========================",
]


def _tail(what: str, lines: list[str]) -> str:
    return f"\n--- {what} (last lines) ---\n" + "\n".join(lines)


def _passing(task_id: str, total: float) -> TaskValidation:
    return TaskValidation(
        id=task_id,
        passed=True,
        reward=1.0,
        rewards={"reward": 1.0},
        timings_sec={"environment": total * 0.3, "agent": total * 0.4, "verifier": total * 0.3, "total": total},
    )


PASSING = [
    "build-pmars-from-source",
    "configure-git-webserver",
    "crack-7z-archive-hash",
    "extract-elf-symbols",
    "fix-code-vulnerability",
    "git-multibranch-deploy",
    "kv-store-grpc",
    "log-summary-date-ranges",
    "polyglot-c-py",
    LONG_ID,
]


def seventeen_task_report() -> ValidationReport:
    """Ten passes and seven failures of every kind a person meets."""
    rows = [_passing(task_id, 11.5 + 7 * i) for i, task_id in enumerate(PASSING)]
    rows += [
        TaskValidation(
            id="openssl-selfsigned-cert",
            passed=False,
            reward=0.0,
            rewards={"reward": 0.0},
            failed_phase="verifier",
            error="reward 0 (expected 1)"
            + _tail("verifier output", ["[31 package-manager progress lines left out]", *PYTEST_TAIL]),
            timings_sec={"environment": 4.1, "agent": 2.0, "verifier": 9.7, "total": 15.8},
            stand_in=STAND_IN,
        ),
        TaskValidation(
            id="multi-source-data-merger",
            passed=False,
            reward=0.0,
            rewards={"reward": 0.0},
            failed_phase="verifier",
            error="verifier did not run its tests (error: No interpreter found for Python 3.12 in managed installations)"
            + _tail(
                "verifier output",
                [*APT_NOISE[-6:], "error: No interpreter found for Python 3.12 in managed installations"],
            ),
            timings_sec={"total": 31.0},
            stand_in=(
                "python:3.11-slim here is an offline stand-in: Debian 12 bookworm, Python 3.11.2, OpenSSL 3.0.17 "
                "(no uv-managed Pythons offline; the real image may behave differently)"
            ),
        ),
        TaskValidation(
            id="secure-archive-extraction-with-path-traversal-guards",
            passed=False,
            reward=0.0,
            rewards={"reward": 0.0},
            failed_phase="agent",
            error="solve.sh exited with status 2"
            + _tail("solve.sh output", [f"extracting member {i:03d}: " + "x" * 150 for i in range(40)]),
            timings_sec={"total": 12.0},
        ),
        TaskValidation(
            id="sanitize-git-repo",
            passed=False,
            failed_phase="environment",
            error=(
                "BaseImageMissingError: base image ubuntu:26.04 is not present and cannot be pulled; no offline recipe "
                "(python -m osmosis_harbor base-images --list); provide the image itself (docker load)"
            ),
            timings_sec={"environment": 0.4, "total": 0.4},
        ),
        TaskValidation(
            id="workshop/day-2/regex-log-parser-with-unicode-normalisation",
            passed=False,
            failed_phase="task",
            error="task workshop/day-2/regex-log-parser-with-unicode-normalisation: tests/test.sh is missing",
        ),
        TaskValidation(
            id="qemu-startup",
            passed=False,
            reward=0.5,
            failed_phase="agent",
            error="step boot: solve.sh exited with status 3; step login: did not run (an earlier step stopped the trial)"
            + _tail("step boot: solve.sh output", ["qemu-system-x86_64: -enable-kvm: no KVM here", "boot: giving up"]),
            steps=[
                StepVerdict(name="fetch-image", ran=True, passed=True, reward=1.0),
                StepVerdict(
                    name="boot",
                    ran=True,
                    passed=False,
                    reward=1.0,
                    failed_phase="agent",
                    error="solve.sh exited with status 3",
                ),
                StepVerdict(name="login", ran=False, passed=False, failed_phase="agent", error="did not run"),
            ],
            timings_sec={"total": 48.2},
        ),
        TaskValidation(
            id="write-compressor",
            passed=False,
            reward=1.0,
            rewards={"reward": 1.0, "ratio": 0.4, "speed": 1.0},
            failed_phase="verifier",
            error="reward ratio=0.4 (expected 1)",
            timings_sec={"total": 64.0},
        ),
    ]
    failed = sum(1 for row in rows if not row.passed)
    return ValidationReport(
        passed=len(rows) - failed, failed=failed, agent="oracle", environment="docker", wall_sec=187.3, tasks=rows
    )
