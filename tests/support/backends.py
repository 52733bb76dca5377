"""The end-to-end tests' backend: the fixture project's workflows and graders, served from a task
directory through a ``TrialQueue`` of 3, on a given SDK path, keeping failed trials."""

from __future__ import annotations

from pathlib import Path

from harbor.models.trial.config import EnvironmentConfig
from harbor.trial.queue import TrialQueue

from osmosis_harbor.backend import HarborBackend
from tests.support.common import FIXTURES, TASKS
from tests.support.sdk_paths import DOCKER, SdkPath

PROJECT = FIXTURES / "rollout_project"
WF = "rollout_fixtures.workflows"
GR = "rollout_fixtures.graders"


def make_backend(
    tmp_path: Path,
    bundles_dir: Path,
    *,
    agent: str,
    grader: str | None = None,
    tasks_dir: Path = TASKS / "template",
    task_mode: str = "template",
    sdk: SdkPath = DOCKER,
    environment: EnvironmentConfig | None = None,
    orchestrator: TrialQueue | None = None,
    **kwargs,
) -> HarborBackend:
    return HarborBackend(
        orchestrator=orchestrator or TrialQueue(n_concurrent=3),
        tasks_dir=tasks_dir,
        task_mode=task_mode,
        agent=f"{WF}:{agent}",
        workflow_config=f"{WF}:fixture_config" if agent in {"OutputWorkflow", "ListWorkflow", "NoneWorkflow"} else None,
        grader=f"{GR}:{grader}" if grader else None,
        grader_config=f"{GR}:fixture_grader_config" if grader == "AnswerGrader" else None,
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=environment or sdk.environment(),
        trials_dir=tmp_path / "trials",
        cleanup_successful_trials=False,
        **kwargs,
    )
