"""What ``HarborBackend``'s constructor makes from its options before it can serve: the task
resolver, the start bound, the bundle, the default environment; and the start-up chores (what
dead owners left, the model client's import), so the backend's module holds only its serving."""

from __future__ import annotations

import logging

from harbor.models.trial.config import EnvironmentConfig

from osmosis_harbor import settings
from osmosis_harbor.backend.options import BackendOptions, locate_project
from osmosis_harbor.backend.workspace import Workspace
from osmosis_harbor.bundle import BundleInfo, build_bundle, inspect_bundle
from osmosis_harbor.errors import BundleError
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.queue_facts import queue_retry
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.ledger.leftovers import Leftover, reap_dead_owners
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.sandbox.sdk.registry import implementation
from osmosis_harbor.tasks.resolver import TaskResolver

__all__ = [
    "adopt_orchestrator",
    "default_environment",
    "preload_model_client",
    "prepared_bundle",
    "reap_leftovers",
    "sandbox_starts",
    "task_resolver",
]

logger = logging.getLogger(__name__)


def task_resolver(options: BackendOptions, workspace: Workspace) -> TaskResolver:
    """The task resolver, with the request boundary the options and settings draw on this host."""
    current = options.settings
    roots = options.task_roots if options.task_roots is not None else current.task_root_paths()
    allow_local_git = options.allow_local_git if options.allow_local_git is not None else current.allow_local_git
    allow_private = options.allow_private_git_hosts
    return TaskResolver(
        options.tasks_dir,
        options.task_mode,
        task_roots=roots,
        allow_local_git=allow_local_git,
        allow_private_git_hosts=allow_private if allow_private is not None else current.allow_private_git_hosts,
        trials_dirs=workspace.sandbox_output_dirs,
    )


def adopt_orchestrator(options: BackendOptions) -> None:
    """Make the user's queue treat our trial errors as their policies say: our policies join
    Harbor's table, and those that must not be retried (ours, or by the user's
    ``override_error_policy``) leave the queue's retries, whenever its ``RetryConfig`` was made."""
    error_policies.install()
    error_policies.exclude_ours(queue_retry(options.orchestrator), options.override_error_policy)


def reap_leftovers(sdk_name: str, config: settings.Settings) -> list[Leftover]:
    """Remove what dead owners left on this SDK (``leftovers.py``). An SDK that cannot answer
    now does not stop the start: the next start or ``cleanup`` retries."""
    try:
        return reap_dead_owners(sdk_name, config)
    except Exception as exc:
        logger.warning("could not reap what dead owners left on %s: %s", sdk_name, exc)
        return []


def sandbox_starts(sdk_name: str, options: BackendOptions) -> SandboxStarts:
    """The bound on sandbox starts: the option, else the SDK's own default."""
    current = options.settings
    return SandboxStarts(
        options.max_concurrent_starts or implementation(sdk_name).max_concurrent_starts,
        batch_window_sec=current.claim_batch_window_ms / 1000,
        batch_max=current.claim_batch_max,
    )


def default_environment() -> EnvironmentConfig:
    return environment_config()


def prepared_bundle(options: BackendOptions) -> BundleInfo | None:
    agent = None if options.is_native else options.agent
    if options.bundle is not None:
        info = inspect_bundle(options.bundle)
        if agent is not None and info.agent_script is None:
            raise BundleError(f"bundle {options.bundle} has no workflow entry point (<pkg>-agent)")
        if options.grader is not None and info.grade_script is None:
            raise BundleError(f"bundle {options.bundle} has no grader entry point (<pkg>-grade)")
        return info
    if agent is None and options.grader is None:
        return None
    code_dir = options.code_dir
    if code_dir is None:
        target = agent if agent is not None else options.grader
        assert target is not None
        code_dir = locate_project(target)
    return build_bundle(
        code_dir,
        workflow=agent,
        workflow_config=options.workflow_config,
        grader=options.grader,
        grader_config=options.grader_config,
        cache_dir=options.bundles_dir or options.settings.bundle_cache(),  # the backend's settings
    )


def preload_model_client() -> None:
    """Import Harbor's LiteLLM configuration now, not on the first trial of a native agent.

    A native agent's module imports litellm synchronously (seconds) when ``Trial.create`` makes
    it, which would block the server's event loop during its first rollout; the constructor runs
    before serving. A workflow's trials never import it (``WorkflowAgent`` skips the parse)."""
    settings.use_bundled_model_prices()
    try:
        import harbor.llms.litellm_config  # noqa: F401
    except ImportError:
        pass
