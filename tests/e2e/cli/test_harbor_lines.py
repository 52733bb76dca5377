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
import importlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import MappingProxyType

import docker
import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.environments.skypilot import _sanitize_dns_name
from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.trial.hooks import TrialEvent, TrialHookEvent
from harbor.trial.queue import TrialQueue
from harbor.utils.optional_import import MissingExtraError

from osmosis_harbor import settings
from osmosis_harbor.errors import AgentSandboxLostError, SandboxSdkMissingError, SandboxUnavailableError, trial_errors
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox import SandboxEnvironment
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.ledger.store import Ledger
from osmosis_harbor.sandbox.options import IMPORT_PATH, SandboxOptions
from osmosis_harbor.sandbox.sdk.registry import implementation
from osmosis_harbor.sandbox.sdk.skypilot_login import check_logged_in
from tests.support.common import TASKS, made_environment, make_task, managed_containers, wait_until
from tests.support.sdk_paths import DOCKER, SdkPath

on_026 = pytest.mark.skipif(not HARBOR.options_model, reason="Harbor 0.25 has no options model or error policies")
on_025 = pytest.mark.skipif(HARBOR.options_model, reason="Harbor 0.26 has both")
HARBOR_CLI = str(Path(sys.executable).parent / "harbor")
# Harbor's CLI sends usage events from a detached Python process per command and per job (an
# import of requests and a connection attempt to a host off this machine): tests reach no such
# host, and the senders cost CPU the run does not check.
HARBOR_CLI_ENV = {**os.environ, "HARBOR_TELEMETRY": "0"}
GATE = "/tmp/solve-gate"
PLAIN = "FROM debian:trixie-slim\n"


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
        [HARBOR_CLI, "environments", "schema", IMPORT_PATH, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=HARBOR_CLI_ENV,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["properties"]["sdk"]["default"] == "skypilot"


def test_our_environment_takes_harbors_own_options(tmp_path: Path) -> None:
    """``auto_mounting`` is Harbor's: 0.26 reads it off our options, 0.25 off its keyword."""
    env = made_environment(make_task(tmp_path, "options"), tmp_path / "trial", "options")
    assert env.auto_mounting is False
    assert env.options.auto_mounting is False and env.options.sdk == "docker"


# ── error policies ──────────────────────────────────────────────────────────────────────
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
def test_on_025_our_errors_have_a_failure_cause_and_drive_nothing_else() -> None:
    """0.25's table names a ``FailureCause`` for reports; its queue retries by RetryConfig alone
    and its agent phase ends the trial ungraded on any error but two: ours get a cause of their
    own (not ``unclassified``) and nothing else changes."""
    from dataclasses import fields

    from harbor.models.trial.error_policy import ErrorPolicy, FailureCause, policy_for

    assert error_policies.install() and error_policies.installed()
    assert {f.name for f in fields(ErrorPolicy)} == {"cause", "retry", "grade"}
    causes = {name: policy_for(name).cause for name in trial_errors()}
    assert causes["AgentSandboxLostError"] is FailureCause.SANDBOX_FAILED
    assert causes["VerifierSandboxLostError"] is FailureCause.SANDBOX_FAILED
    assert causes["BaseImageMissingError"] is FailureCause.SANDBOX_FAILED
    assert causes["VerifierTamperedError"] is FailureCause.VERIFIER_FAILED
    assert causes["TransferLimitError"] is FailureCause.AGENT_EXHAUSTED_BUDGET
    # A workflow's non-zero exit reads as Harbor's own agent's does.
    assert causes["WorkflowFailedError"] is policy_for("NonZeroAgentExitCodeError").cause
    unclassified = sorted(n for n, c in causes.items() if c is FailureCause.UNCLASSIFIED)
    assert unclassified == ["WorkflowFailedError"]
    assert not any(policy_for(name).grade for name in trial_errors())


# ── a RetryConfig made before our policies were known ──────────────────────────────────────────
def _retried(queue: TrialQueue, exception_type: str) -> bool:
    """Whether the installed Harbor's queue would retry a failure of ``exception_type``."""
    retry = queue._retry_config
    if HARBOR.error_policies:
        return bool(retry.is_retryable(exception_type))
    return bool(queue._should_retry_exception(exception_type))


def _early_retry_config(monkeypatch: pytest.MonkeyPatch, **fields: object):
    """A ``RetryConfig`` made while Harbor's table holds none of ours (as one made before
    anything of osmosis_harbor ran would be)."""
    from harbor.models.job.config import RetryConfig

    module = importlib.import_module(error_policies.POLICY_MODULE)
    harbors = MappingProxyType({k: v for k, v in module.ERROR_POLICIES.items() if k not in trial_errors()})
    with monkeypatch.context() as patch:
        patch.setattr(module, "ERROR_POLICIES", harbors)
        return RetryConfig(max_retries=2, min_wait_sec=0, max_wait_sec=0, **fields)


def _oracle_backend(tmp_path: Path, queue: TrialQueue, **kwargs: object):
    from osmosis_harbor.backend import HarborBackend

    return HarborBackend(
        orchestrator=queue,
        tasks_dir=tmp_path / "tasks",
        task_mode="dataset",
        agent="oracle",
        trials_dir=tmp_path / "trials",
        environment_config=DOCKER.environment(),
        **kwargs,
    )


def test_a_retry_config_made_before_our_policies_does_not_retry_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_task(tmp_path / "tasks", "ok")
    queue = TrialQueue(n_concurrent=1, retry_config=_early_retry_config(monkeypatch))
    assert _retried(queue, "WorkflowFailedError") and _retried(queue, "BaseImageMissingError")  # the hazard
    backend = _oracle_backend(tmp_path, queue)
    try:
        for ours in ("WorkflowFailedError", "BaseImageMissingError", "TransferLimitError", "VerifierTamperedError"):
            assert not _retried(queue, ours), ours
        assert _retried(queue, "AgentSandboxLostError") and _retried(queue, "ImageBuildError")  # retries that help
        assert not _retried(queue, "AgentTimeoutError")  # Harbor's own exclusions stay
    finally:
        asyncio.run(backend.shutdown())
    # Exclusions a user wrote out are theirs, as Harbor leaves them: nothing of ours is added.
    written = TrialQueue(n_concurrent=1, retry_config=_early_retry_config(monkeypatch, exclude_exceptions={"X"}))
    backend = _oracle_backend(tmp_path, written)
    try:
        assert written._retry_config.exclude_exceptions == {"X"} and _retried(written, "WorkflowFailedError")
    finally:
        asyncio.run(backend.shutdown())


@on_026
def test_a_users_override_changes_our_backends_queue_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``override_error_policy`` reaches the queue's retries as Harbor's ``JobConfig`` applies it:
    a should_retry=False excludes a type, a should_retry=True lets one of ours be retried."""
    make_task(tmp_path / "tasks", "ok")
    queue = TrialQueue(n_concurrent=1, retry_config=_early_retry_config(monkeypatch))
    overrides = {"AgentSandboxLostError": {"should_retry": False}, "BaseImageMissingError": {"should_retry": True}}
    backend = _oracle_backend(tmp_path, queue, override_error_policy=overrides)
    try:
        assert not _retried(queue, "AgentSandboxLostError") and _retried(queue, "BaseImageMissingError")
        assert not _retried(queue, "WorkflowFailedError")
    finally:
        asyncio.run(backend.shutdown())


@pytest.mark.slow
@pytest.mark.parametrize("protected", [True, False], ids=["ours-excluded", "control-unprotected"])
async def test_harbors_queue_runs_a_trial_failing_with_one_of_our_non_retryable_errors_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protected: bool
) -> None:
    """Through the real queue and the real engine: a task whose base image is missing fails as
    ``BaseImageMissingError``, which no retry can help. With our exclusions the queue's
    RetryConfig (made before our policies were known) runs the trial once; with them switched
    off, the queue tries it three times."""
    from osmosis_ai.rollout.types import ExecutionRequest, RolloutErrorCategory

    absent = f"127.0.0.1:5000/absent-base-{uuid.uuid4().hex[:6]}:1"  # a pull reaches only 127.0.0.1
    make_task(tmp_path / "tasks", "no-base", dockerfile=f"FROM {absent}\n")
    queue = TrialQueue(n_concurrent=1, retry_config=_early_retry_config(monkeypatch))
    starts: list[str] = []

    async def on_start(event: TrialHookEvent) -> None:
        starts.append(event.trial_name)

    queue.add_hook(TrialEvent.START, on_start)
    if not protected:
        monkeypatch.setattr(error_policies, "exclude_ours", lambda retry, overrides=None: set())
    backend = _oracle_backend(tmp_path, queue)
    try:
        outcome = await backend.execute(
            ExecutionRequest(
                id=f"no-base-{uuid.uuid4().hex[:6]}",
                prompt=[{"role": "user", "content": "x"}],
                metadata={"harbor_task_id": "no-base"},
            )
        )
    finally:
        await backend.shutdown()
    result = outcome.result
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR and absent in (result.err_message or "")
    assert len(starts) == (1 if protected else 3), starts


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
    """``harbor run -e <our import path> --ek sdk=...`` on a bundled task, without ``sky.sandbox``:
    Harbor's CLI makes our environment with no backend and no owner anywhere (each environment
    owns itself), and its sandbox is recorded in the ledger and gone from it at the end."""
    ledger = tmp_path / "ledger.sqlite3"
    env = {
        **HARBOR_CLI_ENV,
        **sandbox_sdk.cli_env(),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OSMOSIS_HARBOR_LEDGER": str(ledger),
    }
    jobs = tmp_path / "jobs"
    proc = subprocess.run(
        [HARBOR_CLI, "run", "-p", str(TASKS / "hello-reward-txt"), "-a", "oracle", "-e", IMPORT_PATH]
        + ["--ek", f"sdk={sandbox_sdk.name}", "-o", str(jobs), "-y"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "NoOwnerError" not in output and "needs an owner" not in output
    (result,) = jobs.glob("*/hello-reward-txt__*/result.json")
    trial = json.loads(result.read_text())
    assert trial["exception_info"] is None and trial["verifier_result"]["rewards"] == {"reward": 1.0}
    assert ledger.exists() and Ledger(ledger).entries() == []  # its sandbox was recorded, and went
    assert not sandbox_sdk.sandboxes_left()


# ── a lost sandbox is not graded, through Harbor's TrialQueue ───────────────────────────────────
async def _lose_the_sandbox(tmp_path: Path, **trial: object) -> tuple[dict, list[str]]:
    """An oracle trial whose agent's sandbox is killed while its solution waits on a FIFO:
    its result, and the trials that reached verification."""
    task = make_task(  # an image every run has: the sandbox, not its image, is what is lost
        tmp_path, f"lost-{uuid.uuid4().hex[:6]}", solve=f"mkfifo {GATE} && read x < {GATE}", dockerfile=PLAIN
    )
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
    if not HARBOR.error_policies:  # 0.25 reports who ended the trial: the sandbox, not "unclassified"
        from harbor.models.trial.result import TrialResult

        assert TrialResult.model_validate(result).failure_cause == "sandbox_failed"


@on_026
@pytest.mark.slow
async def test_a_users_override_error_policy_is_honoured(tmp_path: Path) -> None:
    """The user says a lost sandbox is graded: Harbor verifies (and the verifier finds no sandbox)."""
    result, verified = await _lose_the_sandbox(
        tmp_path, override_error_policy={"AgentSandboxLostError": {"should_grade": True}}
    )
    assert result["exception_info"]["exception_type"] == "AgentSandboxLostError"
    assert verified == [result["trial_name"]]
