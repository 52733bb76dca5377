"""The side-by-side's stand-ins for what osmosis-ai 0.3.8's Harbor backend needs and this machine
lacks: the one Harbor 0.24 name it imports, and its Dockerfile patch with the image's Python. The
benchmark itself (``python -m bench --only incumbent``) runs both backends in real sandboxes."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from harbor.trial import network_policy

from bench.incumbent import UV_IMAGE, _harbor_024_compat, _preinstall_sdk


def test_the_incumbent_imports_on_this_harbor_only_with_the_compat_name() -> None:
    had = hasattr(network_policy, "resolve_agent_phase_policy")
    if not had:  # positive control: Harbor 0.25 really lacks the name the incumbent imports
        sys.modules.pop("osmosis_ai.rollout.backend.harbor.environment", None)
        try:
            importlib.import_module("osmosis_ai.rollout.backend.harbor.environment")
        except ImportError as exc:
            assert "resolve_agent_phase_policy" in str(exc)
        else:
            raise AssertionError("the incumbent imported without the compat name")
    _harbor_024_compat()
    module = importlib.import_module("osmosis_ai.rollout.backend.harbor.backend")
    assert module.HarborBackend.__module__ == "osmosis_ai.rollout.backend.harbor.backend"


def test_the_incumbents_sdk_patch_keeps_its_paths_and_uses_the_images_python(tmp_path: Path) -> None:
    from osmosis_ai.rollout.backend.harbor.tasks import SDK_REQUIREMENTS_FILENAME, SDK_UV, SDK_VENV

    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /workspace\n")
    _preinstall_sdk(tmp_path, ["osmosis-ai==0.3.8", "pydantic>=2"])
    text = (tmp_path / "Dockerfile").read_text()
    assert text.startswith("FROM python:3.12-slim\nWORKDIR /workspace\n")
    assert f"COPY --from={UV_IMAGE} /uv {SDK_UV}" in text
    assert f"{SDK_UV} venv {SDK_VENV} --python python3 " in text and "--python 3.12" not in text
    assert (tmp_path / SDK_REQUIREMENTS_FILENAME).read_text() == "osmosis-ai==0.3.8\npydantic>=2\n"


async def test_the_reference_environment_runs_harbors_trial_and_leaves_nothing(tmp_path: Path) -> None:
    """The incumbent's environment (``bench.reference_environment``) is a working Harbor
    environment of its own: an oracle trial through the real ``TrialQueue`` builds the task's
    image, solves and verifies it (reward 1; a nop agent's 0 shows the reward is the task's),
    and its containers are gone after."""
    import docker
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.queue import TrialQueue

    from bench.reference_environment import IMPORT_PATH, LABEL
    from tests.support.common import make_task

    task = make_task(tmp_path, "reference")
    queue = TrialQueue(n_concurrent=2)
    rewards = {}
    for agent in ("oracle", "nop"):
        config = TrialConfig(
            task=TaskConfig(path=task),
            trials_dir=tmp_path / "trials",
            agent=AgentConfig(name=agent),
            environment=EnvironmentConfig(import_path=IMPORT_PATH),
        )
        result = await queue.submit(config)
        assert result.exception_info is None, result.exception_info
        assert result.verifier_result is not None
        rewards[agent] = result.verifier_result.rewards
    assert rewards == {"oracle": {"reward": 1.0}, "nop": {"reward": 0.0}}
    client = docker.from_env()
    assert client.containers.list(all=True, filters={"label": LABEL}) == []
    for image in client.images.list(name="bench-reference/reference"):  # this test's own build
        client.images.remove(image.id, force=True)
