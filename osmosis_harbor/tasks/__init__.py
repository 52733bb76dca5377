"""Harbor tasks on this machine: found (``discovery``), chosen per rollout (``refs``) and
copied for one rollout (``materialize``, with ``prompt``, ``dockerfile`` and ``verifier``)."""

from osmosis_harbor.errors import DatasetError, TaskResolutionError
from osmosis_harbor.shim.contract import CONTAINER_REQUIREMENTS, GRADING_INPUT_FILENAME
from osmosis_harbor.task_toml import task_config
from osmosis_harbor.tasks.discovery import (
    TaskRef,
    check_task,
    discover_tasks,
    load_dataset,
    select_tasks,
)
from osmosis_harbor.tasks.dockerfile import (
    BUNDLE_DIRNAME,
    INCOMPATIBLE_IMAGE_MARKER,
    PATCH_BEGIN,
    REQUIREMENTS_FILENAME,
    EnvironmentPatch,
    baked_bundle,
    patch_environment,
)
from osmosis_harbor.tasks.materialize import MaterializedTask, materialize_task
from osmosis_harbor.tasks.prompt import render_prompt
from osmosis_harbor.tasks.refs import ResolvedTask, TaskMode, UnpinnedTaskRefWarning
from osmosis_harbor.tasks.resolver import TaskResolver
from osmosis_harbor.tasks.verifier import isolate_verifier, task_step_names

__all__ = [
    "BUNDLE_DIRNAME",
    "CONTAINER_REQUIREMENTS",
    "GRADING_INPUT_FILENAME",
    "INCOMPATIBLE_IMAGE_MARKER",
    "PATCH_BEGIN",
    "REQUIREMENTS_FILENAME",
    "DatasetError",
    "EnvironmentPatch",
    "MaterializedTask",
    "ResolvedTask",
    "TaskMode",
    "TaskRef",
    "TaskResolutionError",
    "TaskResolver",
    "UnpinnedTaskRefWarning",
    "baked_bundle",
    "check_task",
    "discover_tasks",
    "isolate_verifier",
    "load_dataset",
    "materialize_task",
    "patch_environment",
    "render_prompt",
    "select_tasks",
    "task_config",
    "task_step_names",
]
