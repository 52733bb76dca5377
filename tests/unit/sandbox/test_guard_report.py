"""The host's half of the verifier guard, without sandboxes: which check reports it believes,
how findings are judged against a task's allowance, and which trials get a guard at all."""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.errors import DatasetError
from osmosis_harbor.sandbox.environment.verifier_guard import baked_guard
from osmosis_harbor.sandbox.guard import Allowance, ReportRejected, judge, parse_report
from osmosis_harbor.sandbox.guard.report import shown
from osmosis_harbor.shim import contract
from osmosis_harbor.tasks.dockerfile import EnvironmentPatch, patch_environment
from osmosis_harbor.tasks.verifier_allowance import guard_plan, recorded_allowance, save_recorded
from tests.support.common import FIXTURES, TASKS

KEY = bytes(range(32))
ODD = b"/usr/lib/x\n\xff.pth"  # a name with a newline and a byte that is not UTF-8


def _hex(text: str | bytes) -> str:
    return (text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text).hex()


def _signed(*lines: str, nonce: str = "n1", record: str = "r1", key: bytes = KEY) -> bytes:
    body = "\n".join(["osmosis-guard-report 1", f"nonce {nonce}", f"id {record}", "marker 27", *lines, "end"]) + "\n"
    mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    return body.encode() + f"hmac {mac}\n".encode()


def _parse(raw: bytes):
    return parse_report(raw, key=KEY, nonce="n1", record_id="r1")


def test_a_signed_report_is_read_field_by_field() -> None:
    raw = _signed(
        "listening 50051 12",
        f"kept 12 50051 {_hex('/usr/bin/python3.13')}",
        f"killed 30 {_hex('/usr/bin/python3.13')} {_hex('python3 /tmp/r.py')}",
        "logs ok",
        "manifest ok",
        f"finding changed - f {_hex('/usr/bin/cat')} {'ab' * 32}",
        f"finding added startup-hook f {_hex(ODD)} -",
        f"cured {_hex('/usr/lib/__pycache__/a.pyc')}",
        f"setaside {_hex('/root/.cache/pip')}",
        "entries 6000",
    )
    report = _parse(raw)
    assert report.listening == {50051: 12} and report.kept[0].port == 50051
    assert report.killed[0].cmdline == "python3 /tmp/r.py" and report.entries == 6000
    assert [f.path for f in report.findings] == ["/usr/bin/cat", os.fsdecode(ODD)]
    assert shown(report.findings[1].path) == "/usr/lib/x\\n\\xff.pth"  # control and stray bytes escaped
    assert report.cured and report.set_aside == ["/root/.cache/pip"]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (_signed("logs ok", key=bytes(32)), "signature"),
        (_signed("logs ok", nonce="other"), "another check"),
        (_signed("logs ok", record="r0"), "another check"),
        (_signed("logs ok")[:-3] + b"00\n", "signature"),
        (_signed("logs ok") + b"trailing\n", "signature"),
        (_signed("logs ok").replace(b"logs ok", b"logs ko"), "signature"),
        (b"osmosis-guard-report 1\nerror no-key\n", "no signed report"),
        (b"", "no signed report"),
        (_signed("bogus line"), "unknown report line"),
        (_signed("finding changed - f zz -"), "not hex"),
        (_signed("killed x - -"), "not a number"),
        (_signed("logs ok") * 300_000, "over"),
    ],
)
def test_anything_but_the_guards_own_report_is_rejected(raw: bytes, why: str) -> None:
    with pytest.raises(ReportRejected, match=why):
        _parse(raw)


def _report(*lines: str):
    return _parse(_signed("logs ok", "manifest ok", *lines))


def test_findings_are_judged_against_the_allowance() -> None:
    digest = "cd" * 32
    report = _report(
        f"finding changed - f {_hex('/etc/ld.so.cache')} {digest}",
        f"finding added harness-tool f {_hex('/usr/local/bin/curl')} {'ee' * 32}",
        f"finding changed - f {_hex('/etc/nginx/nginx.conf')} {'11' * 32}",
    )
    nothing = judge(report, Allowance(), processes_are_tampering=True)
    assert (
        nothing.tampered
        and len(nothing.reasons) == 3
        and "/usr/local/bin/curl added (harness-tool)" in nothing.message()
    )
    recorded = Allowance.recorded(_report(f"finding changed - f {_hex('/etc/ld.so.cache')} {digest}"))
    declared = Allowance(globs=("/etc/nginx/**",))
    partial = judge(report, recorded.merged(declared), processes_are_tampering=True)
    assert partial.reasons == ["/usr/local/bin/curl added (harness-tool)"]
    # the same path with other content is not what the solution left
    other = _report(f"finding changed - f {_hex('/etc/ld.so.cache')} {'00' * 32}")
    assert judge(other, recorded, processes_are_tampering=True).tampered


def test_processes_left_running_are_the_workflows_doing_but_not_a_harness() -> None:
    report = _report(f"killed 31 {_hex('/usr/bin/sleep')} {_hex('sleep 600')}")
    assert judge(report, Allowance(), processes_are_tampering=True).reasons == ["process 31 (sleep 600) left running"]
    native = judge(report, Allowance(), processes_are_tampering=False)
    assert not native.tampered and native.killed == 1
    for line, reason in [
        ("unkillable 40", "process 40 could not be ended"),
        ("truncated findings 17", "17 more findings"),
    ]:
        assert reason in judge(_report(line), Allowance(), processes_are_tampering=False).reasons
    for state, reason in [("missing", "is missing"), ("forged", "is forged")]:
        bad = _parse(_signed("logs ok", f"manifest {state}"))
        assert reason in judge(bad, Allowance(), processes_are_tampering=False).message()
    replaced = _parse(_signed("logs replaced-verifier", "manifest ok"))
    assert judge(replaced, Allowance(), processes_are_tampering=False).reasons == ["/logs/verifier was replaced"]


def test_an_allowance_survives_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_VERIFIER_ALLOWANCES", str(tmp_path / "allow"))
    task = shutil.copytree(FIXTURES / "guard_dataset" / "service-reverse", tmp_path / "task")
    odd = os.fsdecode(b"/opt/\xfe")
    allowance = Allowance(frozenset({("added", "f", odd, "ab" * 32)}), (), frozenset({50051}))
    config = settings.current()
    save_recorded(task, allowance, config)
    assert recorded_allowance(task, config) == allowance
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\necho another solution\n")
    assert recorded_allowance(task, config) == Allowance()  # a changed solution has not been validated


def test_which_trials_get_a_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_VERIFIER_ALLOWANCES", str(tmp_path / "allow"))
    shared = shutil.copytree(FIXTURES / "guard_dataset" / "sum-42", tmp_path / "shared")
    plan = guard_plan(shared, native_agent=False, config=settings.current())
    assert plan is not None and plan.processes_are_tampering and not plan.record_allowance
    native = guard_plan(shared, native_agent=True, record=True, config=settings.current())
    assert native is not None and not native.processes_are_tampering and native.record_allowance
    monkeypatch.setenv("OSMOSIS_HARBOR_VERIFIER_GUARD", "0")
    assert guard_plan(shared, native_agent=False, config=settings.current()) is None
    monkeypatch.delenv("OSMOSIS_HARBOR_VERIFIER_GUARD")
    separate = shutil.copytree(TASKS / "json-reward", tmp_path / "separate")
    toml = separate / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]", '[verifier]\nenvironment_mode = "separate"'))
    assert (
        guard_plan(separate, native_agent=False, config=settings.current()) is None
    )  # its tests never see the agent's sandbox
    declared = shared / "task.toml"
    declared.write_text(
        declared.read_text()
        + '\n[metadata.osmosis_harbor.verifier_allowance]\npaths = ["/etc/nginx/**"]\nports = [8080]\n'
    )
    plan = guard_plan(shared, native_agent=False, config=settings.current())
    assert plan is not None and plan.allowance.globs == ("/etc/nginx/**",) and plan.allowance.ports == {8080}
    declared.write_text(declared.read_text().replace("ports = [8080]", 'ports = ["8080"]'))
    with pytest.raises(DatasetError, match="ports must be TCP ports"):
        guard_plan(shared, native_agent=False, config=settings.current())


def test_the_image_bakes_the_guard_beside_the_bundle(tmp_path: Path) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    wheel, guard = tmp_path / "demo-0.1-py3-none-any.whl", tmp_path / "osmosis-guard"
    wheel.write_bytes(b"wheel")
    guard.write_bytes(b"\x7fELF guard")
    sha = hashlib.sha256(guard.read_bytes()).hexdigest()
    patch_environment(
        env, EnvironmentPatch(requirements=[], wheel=wheel, bundle_key="k1", guard=guard, guard_sha256=sha)
    )
    text = (env / "Dockerfile").read_text()
    assert f"COPY osmosis-bundle/osmosis-guard {contract.GUARD_PATH}" in text and baked_guard(env / "Dockerfile") == sha
    assert (env / "osmosis-bundle" / "osmosis-guard").stat().st_mode & 0o111
    patch_environment(env, EnvironmentPatch(requirements=[], wheel=wheel, bundle_key="k1"))  # without it
    assert baked_guard(env / "Dockerfile") is None and not (env / "osmosis-bundle" / "osmosis-guard").exists()
    with pytest.raises(ValueError, match="only with a baked bundle"):
        EnvironmentPatch(requirements=[], guard=guard, guard_sha256=sha)
