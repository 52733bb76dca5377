"""Shared fixtures of the unit layer on the fake SDK: import them explicitly where used
(``from tests.unit.fake_sky.fixtures import fake_cloud``), so a module says what it relies on.

The fake is selectable as ``sdk="fake"`` through the product's own registry (``register``), the
way any implementation of ``sky.sandbox`` is: no product code knows it exists.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
from osmosis_harbor.sandbox.sdk.registry import SandboxImplementation, register

from . import FakeSky, use

__all__ = ["FAKE", "FAKE_IMAGE", "FAKE_SDK", "fake_cloud", "fake_environment", "fake_task"]

FAKE_SDK = "fake"
FAKE_IMAGE = "fake.local/debian:trixie-slim"
# Nothing here reaches the host, relays an endpoint, keeps exec records or runs an image's
# ENTRYPOINT: every flag is the registration's default, said once.
FAKE = register(SandboxImplementation(FAKE_SDK, "tests.unit.fake_sky"))


@pytest.fixture
def fake_cloud() -> Iterator[FakeSky]:
    """A fresh fake cloud for one test, the one ``sdk="fake"`` talks to; nothing outlives it."""
    with use() as cloud:
        cloud.add_image(FAKE_IMAGE)
        yield cloud


def fake_task(root: Path, name: str = "fake-task", *, workdir: str | None = None) -> Path:
    """A small Harbor task on the fake's prebuilt image (nothing to build): ``docker_image``,
    an optional ``workdir``, a ``test.sh`` writing a reward."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Do the thing.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    lines = [f'docker_image = "{FAKE_IMAGE}"'] + ([f'workdir = "{workdir}"'] if workdir else [])
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[verifier]\ntimeout_sec = 60.0\n[environment]\n' + "\n".join(lines) + "\n"
    )
    return task


def fake_environment(task_dir: Path, trial_dir: Path, **kwargs: Any) -> SandboxEnvironment:
    """Our environment for ``task_dir`` on ``sdk="fake"``, made as a trial makes it (Harbor's
    factory, a trial's paths under ``trial_dir``), not started."""
    task = Task(task_dir)
    trial_paths = TrialPaths(trial_dir)
    trial_paths.mkdir()
    environment = EnvironmentFactory.create_environment_from_config(
        environment_config(FAKE_SDK, **kwargs),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"unit-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
    )
    assert isinstance(environment, SandboxEnvironment)
    return environment
