"""``sandbox-check`` cannot pass by skipping: a skipped check is reported apart and never counted
as passed, a check about a capability the SDK lacks does not run, and the report shows the SDK's
capability set as read from its sandboxes and its registration. Runs on the Docker SDK (real
containers); the capability that the Docker SDK lacks (``num_sandboxes``) stands in for one an
SDK does not offer."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError, SandboxSdkMissingError
from osmosis_harbor.sandbox import conformance, load_sandbox_sdk
from osmosis_harbor.sandbox.conformance.core import Check, CheckResult, CheckStatus, skip
from osmosis_harbor.sandbox.conformance.privilege_checks import parse_privileges
from osmosis_harbor.sandbox.sdk.registry import SDK_NAMES, implementation
from tests.support.common import CliRun, run_cli
from tests.support.emulator import LOCAL_REGISTRY


@pytest.fixture
async def ctx(docker_sandbox_sdk: Any, sandbox_image: str) -> Any:
    context = conformance.ConformanceContext(sdk=docker_sandbox_sdk, image=sandbox_image, settings=settings.current())
    yield context
    await context.close()


@pytest.fixture(scope="module")
def whole_suite(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Callable[[str], tuple[CliRun, dict[str, Any]]]:
    """The whole suite through the command, once per SDK for the module: its run and JSON report
    (what the suite's test and the privileges row's test read). The first use runs it on every
    SDK asked for at once, each in its own process: the checks mostly wait on their sandboxes,
    so the runs overlap instead of queueing."""
    runs: dict[str, tuple[CliRun, Path]] = {}

    def one(sdk: str) -> tuple[CliRun, Path]:
        report = tmp_path_factory.mktemp(f"suite-{sdk}") / "report.json"
        return run_cli("sandbox-check", "--sdk", sdk, "--json", str(report), timeout=900), report

    def run(sdk: str) -> tuple[CliRun, dict[str, Any]]:
        if sdk not in runs:
            wanted = [sdk, *(other for other in WHOLE_SUITE_SDKS if other != sdk and other not in runs)]
            if "skypilot-emulator" in wanted:  # the session's server, not an on-demand one that outlives the run
                request.getfixturevalue("emulator_server")
            with ThreadPoolExecutor(len(wanted)) as pool:
                runs.update(zip(wanted, pool.map(one, wanted), strict=True))
        proc, report = runs[sdk]
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return proc, json.loads(report.read_text())

    return run


def _result(name: str, status: CheckStatus) -> CheckResult:
    return CheckResult(name=name, status=status, detail="", seconds=0.0)


async def test_a_skipped_check_is_reported_apart_and_never_counted_as_passed(ctx: Any) -> None:
    async def needs_a_registry(_ctx: Any) -> str:
        skip("no registry is set")

    result = await conformance.run_check(Check(name="needs_registry", fn=needs_a_registry), ctx)
    assert (result.status, result.passed, result.detail) == (CheckStatus.SKIPPED, False, "no registry is set")
    report = conformance.ConformanceReport(
        sdk="docker",
        image=ctx.image,
        capabilities=await ctx.capabilities(),
        results=[_result("ran", CheckStatus.PASSED), result, _result("n/a", CheckStatus.NOT_APPLICABLE)],
    )
    assert report.counts == {"passed": 1, "failed": 0, "skipped": 1, "not_applicable": 1}
    assert report.summary() == "1 passed, 0 failed, 1 skipped, 1 not applicable"
    assert report.ok() and not report.ok(strict=True)
    failed = report.model_copy(update={"results": [*report.results, _result("broken", CheckStatus.FAILED)]})
    assert not failed.ok()


async def test_a_check_about_a_missing_capability_is_not_applicable_and_does_not_run(ctx: Any) -> None:
    calls: list[str] = []

    async def body(_ctx: Any) -> str:
        calls.append("ran")
        return "ok"

    # The Docker SDK's handles offer no snapshot() (SkyPilot's and the emulator's do).
    missing = await conformance.run_check(Check(name="snap", fn=body, needs=("snapshot",)), ctx)
    assert missing.status is CheckStatus.NOT_APPLICABLE and not missing.passed
    assert "snapshot" in missing.detail and calls == []
    # Control: a capability the Docker SDK offers lets the same body run and pass.
    offered = await conformance.run_check(Check(name="tree", fn=body, needs=("archives",)), ctx)
    assert offered.status is CheckStatus.PASSED and calls == ["ran"]


async def test_the_capability_set_is_read_from_the_sandbox_and_the_registration(ctx: Any) -> None:
    caps = await ctx.capabilities()
    registered = {
        f.name: getattr(implementation("docker"), f.name) for f in dataclasses.fields(implementation("docker"))
    }
    flags = {name: value for name, value in registered.items() if isinstance(value, bool)}
    assert caps.sdk == "docker" and flags and {name: caps.offered[name] for name in flags} == flags
    # Probed, not declared: the shared sandbox's handle offers put_archive/get_archive.
    assert caps.offered["archives"] is True and hasattr(await ctx.shared(), "put_archive")
    # create(pool=, num_sandboxes=k) is offered (batch claims); snapshot() is not
    assert (caps.offered["pools"], caps.offered["num_sandboxes"], caps.offered["snapshot"]) == (True, True, False)


def test_unknown_check_names_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="no_such_check"):
        conformance.selected_checks(only=["no_such_check"])


def test_the_command_reports_capabilities_and_fails_strict_on_a_skip(tmp_path: Path) -> None:
    checks = ["exec_stdout_and_exit_code", "archive_empty_directories", "pool_resize"]
    selection = [word for name in checks for word in ("--check", name)]
    report = tmp_path / "report.json"
    proc = run_cli("sandbox-check", "--sdk", "docker", "--no-pools", *selection, "--json", str(report), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "capabilities of docker" in proc.stdout
    data = json.loads(report.read_text())
    statuses = {r["name"]: (r["status"], r["passed"]) for r in data["results"]}
    assert statuses == {
        "exec_stdout_and_exit_code": ("passed", True),
        "archive_empty_directories": ("passed", True),  # the Docker SDK offers archives: it runs
        "pool_resize": ("skipped", False),
    }
    assert data["counts"] == {"passed": 2, "failed": 0, "skipped": 1, "not_applicable": 0}
    assert data["capabilities"]["offered"]["archives"] is True
    strict = run_cli("sandbox-check", "--sdk", "docker", "--no-pools", "--strict", *selection, timeout=300)
    assert strict.returncode == 1 and "FAILED (--strict)" in strict.stdout, strict.stdout + strict.stderr


# The SDKs whose whole suite the module runs (together): the local ones; any other registered
# SDK (the real SkyPilot one, where it is installed) runs alone when its test asks.
WHOLE_SUITE_SDKS = ("docker", "skypilot-emulator")


@pytest.mark.parametrize("sdk", SDK_NAMES)
def test_sandbox_check_passes_on_each_sdk_with_its_capabilities(
    sdk: str, whole_suite: Callable[[str], tuple[CliRun, dict[str, Any]]]
) -> None:
    """The whole suite through the command, on every registered SDK this machine has (the real
    SkyPilot SDK too, where it is installed): no failure, and each archive check ran exactly
    when the SDK's sandboxes offer archives."""
    try:
        load_sandbox_sdk(sdk)
    except SandboxSdkMissingError as exc:
        pytest.skip(f"{sdk} is not installed here: {exc}")
    proc, data = whole_suite(sdk)
    assert data["counts"]["failed"] == 0 and data["counts"]["passed"] >= 20
    archives = data["capabilities"]["offered"]["archives"]
    archive_checks = {r["status"] for r in data["results"] if r["name"].startswith("archive_")}
    assert archive_checks == ({"passed"} if archives else {"not_applicable"}), (archives, archive_checks)
    if sdk == "docker":  # the reference implementation offers every capability: every check ran and passed
        assert {r["name"]: r["status"] for r in data["results"] if r["status"] != "passed"} == {}
    if sdk == "skypilot-emulator":  # sandboxes pull by reference: the local default image went through the registry
        by_name = {r["name"]: r for r in data["results"]}
        assert f"{LOCAL_REGISTRY}/debian" in proc.stdout
        assert by_name["ls_lists_sandbox"]["detail"] == "status RUNNING"
        assert by_name["environment_image_by_content_hash"]["detail"].startswith(
            f"{LOCAL_REGISTRY}/osmosis-harbor-env:"
        )


def test_the_privileges_row_names_a_sandboxs_capabilities_and_no_new_privileges(
    whole_suite: Callable[[str], tuple[CliRun, dict[str, Any]]],
) -> None:
    """What a team with SkyPilot access reads off its pods: the capability set, decoded, and the
    flag, read from the Docker SDK's whole-suite report. Docker's own default set (``CapEff
    00000000a80425fb``) decodes with NET_RAW in it."""
    default = parse_privileges("CapEff:\t00000000a80425fb\nCapBnd:\t00000000a80425fb\nNoNewPrivs:\t0\n")
    assert {"NET_RAW", "AUDIT_WRITE", "MKNOD"} <= set(default.effective) and not default.no_new_privileges
    _, data = whole_suite("docker")
    (row,) = [r for r in data["results"] if r["name"] == "privileges"]
    assert row["status"] == "passed" and "no-new-privileges set" in row["detail"], row
    named = row["detail"].split(" (bounding set")[0].removeprefix("capabilities ").split(", ")
    assert "NET_RAW" not in named and "AUDIT_WRITE" not in named and {"CHOWN", "SETUID", "MKNOD"} <= set(named), row
