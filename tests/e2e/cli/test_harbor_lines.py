"""Harbor 0.25 and 0.26: what differs between the two lines, checked on the installed one.

CI runs this module on both (``noxfile.py``'s ``tests-harbor-0.26`` session, ``.ci/run``). The
preflight checks only the chosen SDK, on both lines; 0.26's options model is ours; our trial
errors are in 0.26's error policies (a lost sandbox retries and is not graded, a verifier
timeout is not retried, a user's override wins); Harbor's own CLI runs a bundled task with our
environment on each local SDK; and a lost sandbox is not graded, through Harbor's real
``TrialQueue`` and real containers, on both lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.environments.skypilot import _sanitize_dns_name
from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.trial.hooks import TrialEvent, TrialHookEvent
from harbor.trial.queue import TrialQueue
from harbor.utils.optional_import import MissingExtraError

from osmosis_harbor import settings
from osmosis_harbor.errors import AgentSandboxLostError, SandboxSdkMissingError, SandboxUnavailableError
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox import SandboxEnvironment
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.options import IMPORT_PATH, SandboxOptions
from osmosis_harbor.sandbox.sdk.registry import implementation
from osmosis_harbor.sandbox.sdk.skypilot_login import check_logged_in
from tests.support.common import TASKS, made_environment, make_task, managed_containers, wait_until
from tests.support.sdk_paths import DOCKER, SdkPath

on_026 = pytest.mark.skipif(not HARBOR.options_model, reason="Harbor 0.25 has no options model or error policies")
on_025 = pytest.mark.skipif(HARBOR.options_model, reason="Harbor 0.26 has both")
HARBOR_CLI = str(Path(sys.executable).parent / "harbor")
GATE = "/tmp/solve-gate"


# ── preflight: the chosen SDK only ─────────────────────────────────────────────────────────────
def test_preflight_checks_only_the_chosen_sdk() -> None:
    """No ``sky.sandbox`` here: Harbor's own preflight would exit for every SDK; ours only for
    SkyPilot's (the default) when it is the one chosen."""
    SandboxEnvironment.preflight({"sdk": "docker"})
    SandboxEnvironment.preflight({"sdk": "skypilot-emulator"})
    for chosen in ({"sdk": "skypilot"}, {}):
        with pytest.raises(SystemExit, match=r"sdk='skypilot': The SkyPilot Sandbox SDK \('sky.sandbox'\)"):
            SandboxEnvironment.preflight(chosen)
    SandboxEnvironment.preflight(None)  # Harbor 0.25's call: the SDK is unknown, nothing checked
    with pytest.raises(ValueError, match="unknown sandbox option 'nope'"):
        SandboxEnvironment.preflight({"sdk": "docker", "nope": 1})


def test_harbors_own_preflight_call_passes_for_a_local_sdk() -> None:
    if HARBOR.options_model:
        EnvironmentFactory.run_preflight(type=None, import_path=IMPORT_PATH, kwargs={"sdk": "docker"})
        with pytest.raises(SystemExit):
            EnvironmentFactory.run_preflight(type=None, import_path=IMPORT_PATH, kwargs={"sdk": "skypilot"})
    else:
        EnvironmentFactory.run_preflight(type=None, import_path=IMPORT_PATH)  # no kwargs on 0.25


def test_preflight_names_what_is_not_there(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_EMULATOR_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(SystemExit, match="skypilot-emulator server at http://127.0.0.1:9 .* does not answer"):
        SandboxEnvironment.preflight({"sdk": "skypilot-emulator"})
    monkeypatch.delenv("OSMOSIS_HARBOR_EMULATOR_URL")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    for sdk in ("docker", "skypilot-emulator"):  # an on-demand emulator runs on the engine
        with pytest.raises(SystemExit, match=f"sdk='{sdk}': Docker engine not reachable at unix://"):
            SandboxEnvironment.preflight({"sdk": sdk})
    monkeypatch.delenv("SKYPILOT_API_SERVER_ENDPOINT", raising=False)
    with pytest.raises(SandboxUnavailableError, match="sky api login"):
        check_logged_in(settings.current())
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", "http://127.0.0.1:46580")
    check_logged_in(settings.current())


def test_a_missing_sdk_is_harbors_missing_extra_error() -> None:
    with pytest.raises(SandboxSdkMissingError) as raised:
        implementation("skypilot").load()
    error = raised.value
    assert isinstance(error, MissingExtraError) and isinstance(error, RuntimeError)
    assert error.package == "sky.sandbox" and error.extra == "skypilot"
    assert "SkyPilot Platform installer" in str(error) and "pip install 'harbor[" not in str(error)


# ── options: ours are Harbor's model on 0.26 ───────────────────────────────────────────────────
@on_026
def test_harbor_validates_and_shows_our_options() -> None:
    assert SandboxEnvironment.options_model is SandboxOptions
    assert {"sdk", "pool", "pool_size", "host_network", "auto_mounting"} <= set(
        SandboxEnvironment.options_schema()["properties"]
    )
    with pytest.raises(ValueError, match="auto_mounting"):
        SandboxEnvironment.parse_options({"sdk": "docker", "auto_mounting": "yes"})
    shown = subprocess.run(
        [HARBOR_CLI, "environments", "schema", IMPORT_PATH, "--json"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["properties"]["sdk"]["default"] == "skypilot"


def test_our_environment_takes_harbors_own_options(tmp_path: Path) -> None:
    """``auto_mounting`` is Harbor's: 0.26 reads it off our options, 0.25 off its keyword."""
    env = made_environment(make_task(tmp_path, "options"), tmp_path / "trial", "options")
    assert env.auto_mounting is False
    assert env.options.auto_mounting is False and env.options.sdk == "docker"


# ── error policies (0.26) ──────────────────────────────────────────────────────────────────────
@on_026
def test_our_errors_are_in_harbors_error_policies() -> None:
    from harbor.models.job.config import JobConfig, RetryConfig
    from harbor.models.trial.error_policy import ErrorPolicyOverride, policy_for
    from harbor.models.trial.result import ExceptionInfo

    assert error_policies.install() and error_policies.installed()
    lost = policy_for("AgentSandboxLostError")
    assert (lost.should_retry, lost.should_grade, lost.has_valid_reward) == (True, False, False)
    assert policy_for("VerifierSandboxLostError").should_retry
    assert not policy_for("WorkflowFailedError").should_retry  # the workflow's own failure
    assert not policy_for("BaseImageMissingError").should_retry  # a rebuild cannot help
    verifier_timeout = policy_for("VerifierTimeoutError")  # Harbor's own name keeps Harbor's policy
    assert not verifier_timeout.should_retry and verifier_timeout.should_grade
    retry = RetryConfig(max_retries=2)  # made after install: our non-retryable ones excluded
    assert retry.is_retryable("AgentSandboxLostError")
    assert not retry.is_retryable("VerifierTimeoutError") and not retry.is_retryable("WorkflowFailedError")
    # A user's override applies on top of ours, as on top of Harbor's.
    overridden = ExceptionInfo.from_exception(
        AgentSandboxLostError("hb-x", "gone"),
        override_error_policy={"AgentSandboxLostError": ErrorPolicyOverride(should_grade=True)},
    ).policy
    assert overridden.should_grade and overridden.should_retry
    job = JobConfig(override_error_policy={"AgentSandboxLostError": {"should_retry": False}})
    assert not job.retry.is_retryable("AgentSandboxLostError")


@on_025
def test_on_025_the_policy_table_drives_neither_retries_nor_grading() -> None:
    """0.25's table names a ``FailureCause`` for reports; its queue retries by RetryConfig alone
    and its agent phase ends the trial ungraded on any error but two: nothing to join."""
    from dataclasses import fields

    from harbor.models.trial.error_policy import ErrorPolicy

    assert not error_policies.install() and not error_policies.installed()
    assert {f.name for f in fields(ErrorPolicy)} == {"cause", "retry", "grade"}


def test_harbors_pack_commands_are_judged_as_the_installed_harbor_judges_them() -> None:
    import logging

    from osmosis_harbor.harbor_compat.tar_pack import pack_succeeded

    log = logging.getLogger("test")
    changed = "tar: ./agent.log: file changed as we read it"
    assert pack_succeeded(0, stdout="", stderr="", logger=log)
    assert pack_succeeded(1, stdout="", stderr=changed, logger=log) is HARBOR.tar_pack_tolerant
    assert not pack_succeeded(1, stdout="", stderr=f"{changed}\ntar: ./x: Cannot open: Permission denied", logger=log)
    assert not pack_succeeded(2, stdout="", stderr=changed, logger=log)


# ── Harbor's own CLI with our environment ──────────────────────────────────────────────────────
@pytest.mark.slow
def test_harbor_run_with_our_environment_on_a_local_sdk(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    """``harbor run -e <our import path> --ek sdk=...`` on a bundled task, without ``sky.sandbox``."""
    env = {**os.environ, **sandbox_sdk.cli_env(), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    jobs = tmp_path / "jobs"
    proc = subprocess.run(
        [HARBOR_CLI, "run", "-p", str(TASKS / "hello-reward-txt"), "-a", "oracle", "-e", IMPORT_PATH]
        + ["--ek", f"sdk={sandbox_sdk.name}", "-o", str(jobs), "-y"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = jobs.glob("*/hello-reward-txt__*/result.json")
    trial = json.loads(result.read_text())
    assert trial["exception_info"] is None and trial["verifier_result"]["rewards"] == {"reward": 1.0}
    assert not sandbox_sdk.sandboxes_left()


# ── a lost sandbox is not graded, through Harbor's TrialQueue ───────────────────────────────────
async def _lose_the_sandbox(tmp_path: Path, **trial: object) -> tuple[dict, list[str]]:
    """An oracle trial whose agent's sandbox is killed while its solution waits on a FIFO:
    its result, and the trials that reached verification."""
    task = make_task(tmp_path, f"lost-{uuid.uuid4().hex[:6]}", solve=f"mkfifo {GATE} && read x < {GATE}")
    name = f"lost-{uuid.uuid4().hex[:8]}"
    queue = TrialQueue(n_concurrent=1)
    verified: list[str] = []

    async def on_verification(event: TrialHookEvent) -> None:
        verified.append(event.trial_name)

    queue.add_hook(TrialEvent.VERIFICATION_START, on_verification)
    config = TrialConfig(
        task=TaskConfig(path=task),
        trial_name=name,
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(name="oracle"),
        environment=DOCKER.environment(),
        **trial,  # type: ignore[arg-type]
    )
    running = asyncio.ensure_future(queue.submit(config))
    sandbox = _sanitize_dns_name(f"hb-{name}__env")
    api = docker.from_env().api

    def waiting() -> str | None:
        for container in managed_containers(owner_pid=os.getpid()):
            if container["Labels"].get(L.SANDBOX) == sandbox and container["State"] == "running":
                probe = api.exec_create(container["Id"], ["test", "-p", GATE])["Id"]
                api.exec_start(probe)
                if api.exec_inspect(probe)["ExitCode"] == 0:
                    return str(container["Id"])
        return None

    victim = await asyncio.to_thread(wait_until, waiting, timeout=180, what="the solution waiting at its gate")
    api.kill(victim)  # as a lost node would
    result = await running
    return result.model_dump(mode="json"), verified


@pytest.mark.slow
async def test_a_lost_sandbox_is_not_graded(tmp_path: Path) -> None:
    result, verified = await _lose_the_sandbox(tmp_path)
    assert result["exception_info"]["exception_type"] == "AgentSandboxLostError"
    assert verified == [] and result["verifier_result"] is None


@on_026
@pytest.mark.slow
async def test_a_users_override_error_policy_is_honoured(tmp_path: Path) -> None:
    """The user says a lost sandbox is graded: Harbor verifies (and the verifier finds no sandbox)."""
    result, verified = await _lose_the_sandbox(
        tmp_path, override_error_policy={"AgentSandboxLostError": {"should_grade": True}}
    )
    assert result["exception_info"]["exception_type"] == "AgentSandboxLostError"
    assert verified == [result["trial_name"]]
