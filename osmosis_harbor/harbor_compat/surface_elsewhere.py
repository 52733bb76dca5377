"""The Harbor names we depend on outside the environment class: module-level helpers, the error
policies, factories, the queue, tasks and the agent base (``surface.py``)."""

from __future__ import annotations

from osmosis_harbor.harbor_compat.names import BASE, ENV, OVR, V026, C, HarborName, K, R, S

__all__ = ["ELSEWHERE_NAMES"]

NAMES = "harbor_compat/skypilot_names.py"  # re-exported there under public names

ELSEWHERE_NAMES: tuple[HarborName, ...] = (
    # ── module-level helpers ─────────────────────────────────────────────────────────────────
    HarborName("harbor.environments.skypilot", "_SANDBOX_TTL_SEC", "constant", (R,), NAMES, "the TTL Harbor asks for"),
    HarborName("harbor.environments.skypilot", "_MAX_TIMEOUT_SEC", "constant", (R,), NAMES, "SkyPilot's exec cap"),
    HarborName(
        "harbor.environments.skypilot",
        "_REMOTE_TRANSFER_DIR",
        "constant",
        (R,),
        NAMES,
        "Harbor's own sandbox-side staging dir for a packed download, kept so the sandbox sees Harbor's commands",
    ),
    HarborName(
        "harbor.environments.base",
        "_ENV_TRANSFER_TAR_DIR",
        "constant",
        (R,),
        NAMES,
        "where Harbor's filtered download packs in the sandbox; the host-side unpack is ours",
    ),
    HarborName(
        "harbor.environments.base",
        "_TRANSFER_PACK_TIMEOUT_SEC",
        "constant",
        (R,),
        NAMES,
        "Harbor's timeout for packing a filtered download, kept as Harbor's",
    ),
    HarborName(
        BASE,
        "download_dir_filtered",
        "(self, *, source_dir, target_dir, include, exclude, protect)",
        (OVR, C),
        "sandbox/transfer/filtered.py",
        "the same sandbox commands, our bounded extraction on the host (never tarfile)",
    ),
    HarborName(
        BASE,
        "_download_dir_with_exclusions_impl",
        "(self, *, source_dir, target_dir, exclude, service)",
        (OVR,),
        "sandbox/transfer/filtered.py",
        "the same sandbox commands, our bounded extraction on the host (never tarfile)",
    ),
    HarborName("harbor.environments.skypilot", "_sanitize_dns_name", "(value, *, max_len)", (C,), NAMES, "names"),
    HarborName("harbor.environments.definition", "parse_dockerfile_workdir", "(dockerfile_path)", (C,), ENV, "WORKDIR"),
    HarborName(
        "harbor.environments.definition",
        "has_agent_environment_definition",
        "(environment_dir, *, docker_image, extra_docker_compose_paths)",
        (C,),
        ENV,
        "a task without one runs from a named generic pool, as in Harbor",
    ),
    HarborName(
        "harbor.environments.definition",
        "environment_content_hash",
        "(environment_dir, *, docker_image, truncate)",
        (C,),
        "prewarm/warmer.py",
        "groups tasks by environment the way environment_id does",
    ),
    HarborName(
        "harbor.cli.lint",
        "_selected_rules",
        "(root, cli_config)",
        (C,),
        "harbor_compat/lint_rules.py",
        "the rule selection behind `harbor lint`, private to Harbor's CLI",
    ),
    HarborName("harbor.lint", "lint_task", "(root, *, selected_rules)", (C,), "validate/lint.py", "Harbor's lint"),
    HarborName(
        "harbor.environments.tar_transfer",
        "tar_pack_succeeded",
        "(return_code, *, stdout, stderr, logger)",
        (C,),
        "harbor_compat/tar_pack.py",
        "Harbor's pack commands judged as Harbor judges them (filtered downloads)",
        V026,
    ),
    # ── error policies (0.26): ours joined to Harbor's table ────────────────────────────────
    HarborName(
        "harbor.models.trial.error_policy",
        "ERROR_POLICIES",
        "constant",
        (R, S),
        "harbor_compat/error_policies.py",
        "our trial errors' policies added beside Harbor's; policy_for and default_retry_exclusions read it per call",
        V026,
    ),
    HarborName(
        "harbor.models.trial.error_policy",
        "ErrorPolicy",
        "(should_retry, should_grade, has_valid_reward)",
        (C,),
        "harbor_compat/error_policies.py",
        "each of our policies",
        V026,
    ),
    HarborName(
        "harbor.models.trial.error_policy",
        "policy_for",
        "(exception_type, override)",
        (R,),
        "harbor_compat/error_policies.py",
        "Harbor's lookup, a user's override applied on top of the table's entry",
        V026,
    ),
    # ── factories, queue, tasks, agents ──────────────────────────────────────────────────────
    HarborName(
        "harbor.environments.factory:EnvironmentFactory",
        "create_environment_from_config",
        "(config, environment_dir, environment_name, session_id, trial_paths, task_env_config, logger, **kwargs)",
        (C,),
        "prewarm/warmer.py, sandbox/conformance/environment_checks.py",
        "environments made the way a trial makes them",
    ),
    HarborName(
        "harbor.agents.factory:AgentFactory",
        "create_agent_from_config",
        "(config, logs_dir, **kwargs)",
        (C,),
        "prewarm/setup_proof.py",
        "the setup proof runs the trial's own agent",
    ),
    HarborName("harbor.trial.queue:TrialQueue", "submit", "(self, trial_config)", (C,), "backend/", "runs trials"),
    HarborName(
        "harbor.trial.queue:TrialQueue", "add_hook", "(self, event, callback)", (C,), "backend/, validate/", "status"
    ),
    HarborName(
        "harbor.trial.queue:TrialQueue",
        "__init__",
        "(self, n_concurrent, retry_config, hooks)",
        (C,),
        "harbor_compat/queue_facts.py",
        "each worker process makes a queue of its own (workers=N)",
    ),
    *(
        HarborName("harbor.trial.queue:TrialQueue", name, "attribute", (R,), "harbor_compat/queue_facts.py", why)
        for name, why in (
            ("_n_concurrent", "the queue's slots: the backend's gate, and each worker's share"),
            ("_retry_config", "the user's retry policy, carried into each worker's queue"),
            ("_hooks", "user hooks, which a worker process cannot run: refused by name"),
            ("_agent_pool_limits", "per-agent concurrency pools N queues cannot share: refused by name"),
        )
    ),
    HarborName(
        "harbor.tasks.client:TaskClient",
        "download_tasks",
        "(self, task_ids, overwrite, output_dir, export, on_task_download_start, on_task_download_complete)",
        (C,),
        "tasks/remote.py",
        "remote tasks into our cache (output_dir=)",
    ),
    HarborName(
        "harbor.tasks.client:TaskClient",
        "_run_git",
        "(self, *args, cwd, input)",
        (OVR, K),
        "tasks/git_client.py",
        "a request's git commands connect only to the checked addresses",
    ),
    HarborName(
        "harbor.tasks.client:TaskClient",
        "_run_git_stdout",
        "(self, *args, cwd)",
        (OVR, K),
        "tasks/git_client.py",
        "a request's git commands connect only to the checked addresses",
    ),
    HarborName(
        "harbor.tasks.client:TaskClient",
        "_pull_lfs_files",
        "(self, repo_dir, task_download_configs)",
        (OVR,),
        "tasks/git_client.py",
        "git-lfs downloads go anywhere: refused for a pinned fetch",
    ),
    HarborName(
        "harbor.agents.base:BaseAgent",
        "__init__",
        "(self, logs_dir, model_name, logger, mcp_servers, skills_dir, *, extra_env, base_url, model_api_key_name, "
        "model_api_format, skip_model_parsing, load_trajectory, environment_logs_dir, **kwargs)",
        (C,),
        "agents/workflow.py",
        "WorkflowAgent passes logs_dir, model_name and the rest through",
    ),
    HarborName("harbor.agents.base:BaseAgent", "name", "()", (OVR,), "agents/workflow.py", "the agent's name"),
    HarborName("harbor.agents.base:BaseAgent", "version", "(self)", (OVR,), "agents/workflow.py", "the wheel's name"),
    HarborName("harbor.agents.base:BaseAgent", "setup", "(self, environment)", (OVR,), "agents/workflow.py", "install"),
    HarborName(
        "harbor.agents.base:BaseAgent",
        "run",
        "(self, instruction, environment, context)",
        (OVR,),
        "agents/workflow.py",
        "run",
    ),
    HarborName(
        "harbor.agents.base:BaseAgent",
        "populate_context_post_run",
        "(self, context)",
        (OVR,),
        "agents/workflow.py",
        "none",
    ),
)
