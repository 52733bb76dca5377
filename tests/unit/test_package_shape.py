"""The package's shape: a side-effect-free public face, one error base that the command
line turns into one line, typed classification of our own trial errors, one settings model, the
sandbox registry, the host<->sandbox contract, and the shim's deadline set from the request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import ExecutionRequest, RolloutErrorCategory

from osmosis_harbor import errors, settings
from osmosis_harbor.cli import EXIT_USAGE, run_guarded
from osmosis_harbor.sandbox.sdk.registry import implementation, load_sandbox_sdk, name_of
from osmosis_harbor.serving.local import ARTIFACT_ROOT_ENV, local_trajectories
from osmosis_harbor.trials.reading import TrialPhase, phase_of_exception
from tests.support.common import FIXTURES, REPO, TASKS


def test_importing_the_package_has_no_side_effects() -> None:
    """No environment write, no Harbor or Docker import; every public name resolves lazily."""
    probe = (
        "import json, os, sys\n"
        "before = dict(os.environ)\n"
        "import osmosis_harbor\n"
        "changed = sorted(set(os.environ.items()) ^ set(before.items()))\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('harbor', 'docker', 'litellm'))\n"
        "names = {n: callable(getattr(osmosis_harbor, n)) for n in osmosis_harbor.__all__}\n"
        "print(json.dumps({'changed': changed, 'heavy': heavy, 'names': names}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["changed"] == [] and report["heavy"] == []
    assert report["names"] and all(report["names"].values()), report["names"]  # classes and functions


def test_the_cli_turns_exactly_our_errors_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def user_error() -> int:
        raise errors.ConfigError("max_queue_depth must be None (unbounded) or >= 1, got 0")

    def bug() -> int:
        raise ValueError("a bug, not the user's input")

    assert run_guarded(user_error) == EXIT_USAGE
    assert capsys.readouterr().err == "error: max_queue_depth must be None (unbounded) or >= 1, got 0\n"
    with pytest.raises(ValueError, match="a bug"):  # a bug keeps its traceback
        run_guarded(bug)
    with pytest.raises(errors.ConfigError):  # -v: the whole story, for bug reports
        run_guarded(user_error, verbose=True)


def test_our_trial_errors_are_classified_by_type() -> None:
    """Harbor records only the class name; our classes carry the phase and the category."""
    assert phase_of_exception("WorkflowFailedError") is TrialPhase.AGENT
    assert (
        phase_of_exception("BundleInstallError")
        is phase_of_exception("IncompatibleTaskImageError")
        is TrialPhase.AGENT_SETUP
    )
    assert phase_of_exception("ImageBuildError") is TrialPhase.ENVIRONMENT
    assert phase_of_exception("SandboxLostError") is None  # the phase that was running
    assert phase_of_exception("AgentTimeoutError") is TrialPhase.AGENT  # Harbor's own, by name
    assert errors.recorded_error("IncompatibleTaskImageError").category is RolloutErrorCategory.VALIDATION_ERROR
    assert errors.recorded_error("ValueError") is None
    for name in ("WorkflowFailedError", "BundleInstallError", "ImageBuildError", "SandboxLostError"):
        cls = errors.recorded_error(name)
        assert cls is not None and issubclass(cls, errors.OsmosisHarborError)
        assert cls.phase is None or TrialPhase(cls.phase)


def test_every_error_we_raise_has_the_one_base() -> None:
    found = [obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, Exception)]
    assert len(found) >= 20 and all(issubclass(cls, errors.OsmosisHarborError) for cls in found)
    lost = errors.SandboxLostError("hb-x", "container gone")
    assert (lost.sandbox_name, lost.reason) == ("hb-x", "container gone") and "hb-x" in str(lost)


def test_settings_are_read_from_the_environment_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("OSMOSIS_HARBOR_LOCK_DIR", "OSMOSIS_HARBOR_REGISTRY", "HARBOR_SKYPILOT_REGISTRY", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert settings.current().pool_lock_dir() == tmp_path / "home" / ".cache" / "osmosis-harbor" / "locks"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert settings.current().pool_lock_dir() == tmp_path / "cache" / "osmosis-harbor" / "locks"
    monkeypatch.setenv("OSMOSIS_HARBOR_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("HARBOR_SKYPILOT_REGISTRY", "127.0.0.1:5000")
    monkeypatch.setenv("DOCKER_HOST", "unix:///elsewhere.sock")
    current = settings.current()
    assert (current.pool_lock_dir(), current.registry, current.docker_host) == (
        tmp_path / "locks",
        "127.0.0.1:5000",
        "unix:///elsewhere.sock",
    )


def test_a_local_rollout_keeps_its_trajectories_in_a_scoped_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The osmosis server's artifact root is pointed away for the block only; $HOME is never touched."""
    from osmosis_ai.rollout.utils.file_artifacts import default_artifact_root

    monkeypatch.delenv(ARTIFACT_ROOT_ENV, raising=False)
    monkeypatch.delenv("OSMOSIS_HARBOR_KEEP_HOME", raising=False)
    home = os.environ.get("HOME")
    with local_trajectories(keep_home=settings.current().keep_home) as root:
        assert root is not None and root.is_dir() and default_artifact_root() == root
        assert os.environ.get("HOME") == home
    assert ARTIFACT_ROOT_ENV not in os.environ and not root.exists()
    monkeypatch.setenv("OSMOSIS_HARBOR_KEEP_HOME", "1")
    with local_trajectories(keep_home=settings.current().keep_home) as kept:
        assert kept is None and ARTIFACT_ROOT_ENV not in os.environ


def test_sandbox_implementations_are_registered_and_loadable() -> None:
    """What each registered implementation can do is checked by what it does (the conformance
    suite, the loopback refusals on the SkyPilot path), not by its flags here."""
    sdk = load_sandbox_sdk("docker")
    assert name_of(sdk) == "docker"
    for call in ("create", "ls", "create_pool", "set_pool_size", "delete_pool", "get_pool"):
        assert callable(getattr(sdk, call)) and callable(getattr(sdk, call).aio)
    with pytest.raises(errors.ConfigError, match="unknown sandbox sdk 'kubernetes': choose one of docker, skypilot"):
        implementation("kubernetes")


def test_the_contract_ships_in_the_shim_of_every_bundle() -> None:
    from osmosis_harbor.bundle.shim import load_shim
    from osmosis_harbor.shim import contract

    files = load_shim().files
    assert "contract.py" in files and b"import osmosis_harbor" not in files["contract.py"]
    # the sandbox reads the host's definitions: only the shim's own package name is rewritten
    host = [line for line in Path(contract.__file__).read_text().splitlines() if "osmosis_harbor" not in line]
    shipped = [line for line in files["contract.py"].decode().splitlines() if "osmosis_harbor" not in line]
    assert host and shipped == host


def test_the_shim_deadline_is_set_from_the_request_before_harbors(tmp_path: Path) -> None:
    """OSMOSIS_AGENT_TIMEOUT_SEC reaches the workflow's exec (through the agent's kwargs), a little
    under the request's agent_timeout_sec, so the shim writes a clean error.json first."""
    from osmosis_harbor.agents.workflow import agent_timeout_budget
    from osmosis_harbor.backend import HarborBackend
    from osmosis_harbor.sandbox import environment_config

    assert agent_timeout_budget(None) is None and agent_timeout_budget(4.0) == 3.6
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=TASKS / "template",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=None,  # the session's cache ($OSMOSIS_HARBOR_BUNDLES, tests/conftest.py)
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
    )
    asyncio = __import__("asyncio")
    task = asyncio.run(backend.resolver.resolve(None))
    request = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "hi"}], agent_timeout_sec=40)
    try:
        plan = backend.planner.plan(task, request)  # prepares the task's copies in the backend's work root
        config = backend.planner.trial_config(
            plan, request, work=tmp_path / "work", trial_name="t", trials_dir=tmp_path / "trials", url="", key_env=""
        )
    finally:
        asyncio.run(backend.shutdown())  # removes that work root
    assert config.agent.override_timeout_sec == 40 and config.agent.kwargs["shim_timeout_sec"] == 36.0
