"""HarborBackend's constructor: the v0.3 contract, migration errors, and input checks that
must fail before any sandbox starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.bundle import BundleError
from osmosis_harbor.errors import TaskResolutionError
from osmosis_harbor.sandbox import SandboxSdkMissingError, environment_config
from tests.support.common import FIXTURES, TASKS

PROJECT = FIXTURES / "rollout_project"


def kwargs(**overrides):
    base = dict(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=TASKS / "template",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        code_dir=PROJECT,
        environment_config=environment_config("docker"),
    )
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    "legacy",
    ["task_dir", "user_code_dir", "workflow", "custom_tests_dir", "prebuild_local_image", "symlink_environment"],
)
def test_pre_v03_keywords_raise_type_error_with_migration_hint(legacy: str) -> None:
    with pytest.raises(TypeError, match=rf"{legacy}=.*migration guide"):
        HarborBackend(**kwargs(**{legacy: Path(".")}))


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword"):
        HarborBackend(**kwargs(frobnicate=True))


@pytest.mark.parametrize("depth", [0, -3])
def test_queue_depth_below_one_is_rejected(depth: int) -> None:
    with pytest.raises(ValueError, match="max_queue_depth"):
        HarborBackend(**kwargs(max_queue_depth=depth))


def test_default_environment_is_skypilot_and_says_what_to_install() -> None:
    with pytest.raises(SandboxSdkMissingError, match="SkyPilot Platform installer"):
        HarborBackend(**kwargs(environment_config=None))


def test_bundle_errors_surface_at_construction(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="pyproject.toml"):
        HarborBackend(**kwargs(code_dir=tmp_path))
    with pytest.raises(BundleError):
        HarborBackend(**kwargs(agent="rollout_fixtures.workflows:NoSuchWorkflow", bundles_dir=tmp_path / "b"))


def test_tasks_dir_is_checked_for_the_mode(tmp_path: Path) -> None:
    with pytest.raises(TaskResolutionError, match="has no task.toml: template mode needs one task directory"):
        HarborBackend(**kwargs(tasks_dir=TASKS, task_mode="template", bundles_dir=tmp_path))
    with pytest.raises(TaskResolutionError, match="missing' is not a directory"):
        HarborBackend(**kwargs(tasks_dir=tmp_path / "missing", task_mode="dataset", bundles_dir=tmp_path))


def test_prebuilt_bundle_round_trip(tmp_path: Path) -> None:
    first = HarborBackend(**kwargs(bundles_dir=tmp_path))
    assert first.bundle is not None and first.bundle.agent_script == "rollout-fixtures-agent"
    second = HarborBackend(**kwargs(code_dir=None, bundle=first.bundle.wheel))
    assert second.bundle.wheel == first.bundle.wheel and second.bundle.key == first.bundle.key


def test_code_dir_is_found_from_the_workflow_when_omitted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(PROJECT))
    backend = HarborBackend(**kwargs(code_dir=None, bundles_dir=tmp_path))
    assert backend.bundle is not None and backend.bundle.package == "rollout_fixtures"
    with pytest.raises(ValueError, match="pass code_dir="):
        HarborBackend(**kwargs(code_dir=None, agent="no_such_module_anywhere:Workflow", bundles_dir=tmp_path))
