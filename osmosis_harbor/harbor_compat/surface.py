"""Every Harbor name we depend on beyond a plain call of its documented API, in one place.

Harbor's ``SkypilotEnvironment`` is subclassed, not wrapped
(``sandbox/environment/sandbox_environment.py``): trials take Harbor's own code path, and that
couples us to its private names. We skip its ``__init__`` and
set its attributes ourselves, override its private methods, call others, and carry a copy of
``_create_sandbox`` with the SDK swapped in. Elsewhere we call a private helper of Harbor's lint
CLI, copy a command its verifier builds, and subclass its agent base. Each such name is listed
here: the Harbor object, the name, the shape we rely on (parameter names and kinds, or what kind
of attribute it is), how we use it and why. ``tests/test_harbor_surface.py`` checks each against
the installed Harbor, and checks that the list is complete, so a Harbor release that renames or
reshapes one fails there, by name, instead of inside a trial. An entry holds on the Harbor
lines it names (``lines``, ``version.py``): where 0.25 and 0.26 differ, each has its own entry,
and the test checks the installed line's (`surface_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from osmosis_harbor.harbor_compat.version import HARBOR, LINES

__all__ = ["BASE", "SKY", "SURFACE", "HarborName", "Use", "surface_for"]


class Use(StrEnum):
    OVERRIDE = "override"  # we replace it, and Harbor's code calls ours
    CALL = "call"  # we call it (often through super()), or rely on Harbor calling it on our object
    READ = "read"  # a property, attribute or constant we read
    SET = "set"  # an attribute Harbor's methods read, set by us because its __init__ is skipped
    COPY = "copy"  # we carry a copy of its logic, or of a command it builds


@dataclass(frozen=True)
class HarborName:
    """``owner`` is ``module`` or ``module:Class``; ``shape`` is the canonical signature (names
    and kinds, no annotations or defaults: ``shapes.shape_of``) or ``property`` / ``cached_property`` /
    ``attribute`` (assigned in the owner's ``__init__``) / ``constant`` / ``class``; ``lines``: the
    Harbor lines it holds on (all by default)."""

    owner: str
    name: str
    shape: str
    uses: tuple[Use, ...]
    where: str
    why: str
    lines: tuple[str, ...] = tuple(LINES)

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.name}"


SKY = "harbor.environments.skypilot:SkypilotEnvironment"
BASE = "harbor.environments.base:BaseEnvironment"
ENV = "sandbox/environment/sandbox_environment.py"
IMAGES = "sandbox/environment/images.py"
LIFECYCLE = "sandbox/environment/own_sandbox.py"
BOUNDS = "sandbox/sdk/bounds.py"
PREPARATION = "sandbox/environment/preparation.py"
EXEC_RECORDS = "sandbox/environment/exec_records.py"
GUARD = "sandbox/environment/verifier_guard.py"
OVR, C, R, S, K = Use.OVERRIDE, Use.CALL, Use.READ, Use.SET, Use.COPY


V025, V026 = ("0.25",), ("0.26",)


def _set(name: str, why: str, lines: tuple[str, ...] = tuple(LINES)) -> HarborName:
    return HarborName(SKY, name, "attribute", (S, R), ENV, why, lines)


SURFACE: tuple[HarborName, ...] = (
    # ── SkypilotEnvironment's construction: skipped, its attributes set by us ──────────────
    HarborName(
        SKY,
        "__init__",
        "(self, environment_dir, environment_name, session_id, trial_paths, task_env_config, *, "
        "registry, pool, context_name, namespace, secrets, platform, **kwargs)",
        (K,),
        ENV,
        "skipped: it refuses to run unless Harbor imported sky.sandbox at import time; ours takes "
        "the same keywords and sets the attributes below itself",
        V025,
    ),
    HarborName(
        SKY,
        "__init__",
        "(self, *args, **kwargs)",
        (K,),
        ENV,
        "skipped: it refuses to run unless Harbor imported sky.sandbox at import time; ours takes "
        "SkypilotOptions' fields (SandboxOptions has each) and sets the attributes below itself",
        V026,
    ),
    _set("_pool", "the pool a launch claims from; Harbor's _validate_definition reads it during init", V025),
    _set("_registry", "where images are pushed (Harbor's _image_ref and ours)"),
    _set("_context_name", "passed to create"),
    _set("_namespace", "passed to create"),
    _set("_secrets", "passed to create"),
    _set("_platform", "the build platform"),
    _set("_sandbox", "the live handle every Harbor method uses (_require_sandbox, stop)"),
    _set("_workdir", "the Dockerfile's WORKDIR, Harbor's exec cwd fallback"),
    _set("_sandbox_name", "the DNS-1123 sandbox name"),
    HarborName(
        BASE,
        "__init__",
        "(self, environment_dir, environment_name, session_id, trial_paths, task_env_config, logger, "
        "override_cpus, override_memory_mb, override_storage_mb, override_gpus, override_tpu, "
        "cpu_enforcement_policy, memory_enforcement_policy, persistent_env, mounts, network_policy, "
        "phase_network_policies, extra_docker_compose, *args, stream, enable_environment_dir_upload, "
        "auto_mounts, auto_mounting, **kwargs)",
        (C,),
        ENV,
        "called directly in place of SkypilotEnvironment.__init__",
    ),
    HarborName(BASE, "_persistent_env", "attribute", (R,), ENV, "the trial's env, passed to create as Harbor does"),
    HarborName(
        BASE, "_enable_environment_dir_upload", "attribute", (R,), ENV, "Harbor's pool rule (_validate_definition)"
    ),
    # ── options and preflight ────────────────────────────────────────────────────────────────
    HarborName(
        BASE,
        "options",
        "attribute",
        (S, R),
        ENV,
        "set (our SandboxOptions) before BaseEnvironment.__init__, which then keeps it and reads auto_mounting",
        V026,
    ),
    HarborName(BASE, "options_model", "constant", (R,), ENV, "the model Harbor validates --ek with (None)", V026),
    HarborName(SKY, "options_model", "class", (OVR,), ENV, "SandboxOptions in place of SkypilotOptions", V026),
    HarborName(
        BASE,
        "parse_options",
        "(kwargs)",
        (OVR,),
        ENV,
        "SandboxOptions.build: our kwargs carry Harbor's own keywords beside ours",
        V026,
    ),
    HarborName(BASE, "options_schema", "()", (C,), ENV, "`harbor environments schema` shows SandboxOptions", V026),
    HarborName(
        BASE, "preflight", "(kwargs)", (OVR, C), ENV, "Harbor's options check, then the chosen SDK's check", V026
    ),
    HarborName(
        SKY, "preflight", "()", (OVR,), ENV, "not run: it exits without sky.sandbox whatever the chosen SDK", V025
    ),
    HarborName(
        SKY, "preflight", "(kwargs)", (OVR,), ENV, "not run: it exits without sky.sandbox whatever the chosen SDK", V026
    ),
    HarborName(
        "harbor.utils.optional_import:MissingExtraError",
        "__init__",
        "(self, *, package, extra, hint)",
        (K,),
        "harbor_compat/missing_sdk.py",
        "the registry's SandboxSdkMissingError subclasses it, setting package and extra itself (its message is ours)",
    ),
    HarborName(BASE, "environment_id", "cached_property", (R,), ENV, "content hash: image tags and pool groups"),
    # ── images ──────────────────────────────────────────────────────────────────────────────
    HarborName(SKY, "_image_ref", "property", (OVR, C), IMAGES, "one image per environment content; local names"),
    HarborName(
        SKY, "_image_exists", "(self)", (OVR,), IMAGES, "`docker manifest inspect` fails on plain-http registries"
    ),
    HarborName(
        SKY,
        "_build_and_push_image",
        "(self)",
        (OVR, C),
        IMAGES,
        "with a registry, one attempt of Harbor's own (tenacity's retry_with; our retry knows a missing base, "
        "its RuntimeError becomes ImageBuildError); without one: built locally, never pushed",
    ),
    HarborName(SKY, "_resolve_image", "(self, force_build)", (OVR,), IMAGES, "each image built once across trials"),
    HarborName(SKY, "_dockerfile_path", "property", (R,), IMAGES, "what is built, and the baked-bundle marker"),
    HarborName(
        SKY,
        "_validate_definition",
        "(self)",
        (OVR, K),
        ENV,
        "Harbor's rule for the pool this environment claims (0.26's reads its options' pool, our base name)",
    ),
    # ── sandbox lifecycle ────────────────────────────────────────────────────────────────────
    HarborName(
        SKY,
        "_create_sandbox",
        "(self, image)",
        (OVR, K),
        LIFECYCLE,
        "Harbor's calls the module-global sky_sandbox: ours is a copy of its two create calls over the "
        "chosen SDK, plus host networking and no sandbox left by a cancellation",
    ),
    HarborName(
        SKY,
        "_upload_environment_dir_after_start",
        "(self)",
        (OVR, C),
        LIFECYCLE,
        "a group pool's image holds environment/ already; a generic pool gets Harbor's upload",
    ),
    HarborName(BASE, "_upload_environment_dir_after_start", "(self)", (C,), ENV, "what a plain start uploads"),
    HarborName(
        SKY, "_terminate_sandbox", "(self)", (OVR, C), LIFECYCLE, "deferred off the trial's path; else Harbor's"
    ),
    HarborName(SKY, "_require_sandbox", "(self)", (C,), LIFECYCLE, "the live handle, or Harbor's error"),
    HarborName(SKY, "stop", "(self, delete)", (OVR, C), LIFECYCLE, "drops staged uploads; the live-sandbox registry"),
    HarborName(BASE, "_effective_cpus", "property", (OVR, R), BOUNDS, "Harbor's documented default sizing (bounds.py)"),
    HarborName(BASE, "_effective_memory_mb", "property", (OVR, R), BOUNDS, "Harbor's documented default sizing"),
    HarborName(BASE, "_network_disabled", "property", (R,), ENV, "block_network, pool shape, host networking"),
    # ── commands and transfers ───────────────────────────────────────────────────────────────
    HarborName(SKY, "exec", "(self, command, cwd, env, timeout_sec, user)", (OVR, C), ENV, "lost sandboxes; flushes"),
    HarborName(SKY, "_run_shell", "(self, command, *, timeout_seconds)", (OVR, C), ENV, "lost sandboxes; flushes"),
    HarborName(
        SKY,
        "_dispatch_exec",
        "(self, argv, *, workdir, timeout_seconds, env)",
        (OVR, C),
        f"{EXEC_RECORDS}, {GUARD}",
        "each exec under a record in the sandbox, re-read after an API fault on its result; every argv of a "
        "guarded agent phase behind the verifier guard's drop, and the guard's own commands sent as they are",
    ),
    HarborName(
        SKY, "_drain_stream", "(stream)", (C,), f"{EXEC_RECORDS}, {GUARD}", "a handle's stream as Harbor reads it"
    ),
    HarborName(SKY, "_write_remote_bytes", "(self, data, remote_path)", (OVR, C), ENV, "lost sandboxes"),
    HarborName(SKY, "_read_remote_bytes", "(self, remote_path)", (OVR, C), ENV, "lost sandboxes"),
    HarborName(SKY, "upload_dir", "(self, source_dir, target_dir)", (OVR, C), ENV, "archive capability, when offered"),
    HarborName(SKY, "upload_file", "(self, source_path, target_path)", (OVR, C), ENV, "archive capability"),
    HarborName(SKY, "download_dir", "(self, source_dir, target_dir)", (OVR, C), ENV, "archive capability"),
    HarborName(SKY, "download_file", "(self, source_path, target_path)", (OVR, C), ENV, "archive capability"),
    HarborName(BASE, "is_dir", "(self, path, user)", (OVR, C), ENV, "answered from an archive snapshot"),
    HarborName(BASE, "is_file", "(self, path, user)", (OVR, C), ENV, "answered from an archive snapshot"),
    HarborName(
        BASE, "ensure_dirs", "(self, dirs, *, chmod)", (OVR, C), PREPARATION, "no-op on a known-fresh baked sandbox"
    ),
    HarborName(
        BASE, "empty_dirs", "(self, dirs, *, chmod)", (OVR, C), PREPARATION, "no-op on a known-fresh baked sandbox"
    ),
    HarborName(BASE, "_resolve_user", "(self, user)", (C,), ENV, "which preparation commands run as root"),
    HarborName(BASE, "_merge_env", "(self, env)", (C,), LIFECYCLE, "a head start's early command gets Harbor's env"),
    HarborName(
        BASE,
        "_empty_dirs_command",
        "(self, dirs, *, chmod)",
        (C,),
        LIFECYCLE,
        "a head start empties the agent's workdir with Harbor's own command, early",
    ),
    HarborName(BASE, "_reset_dirs_user", "(self)", (C,), LIFECYCLE, "the user Harbor's empty_dirs runs as"),
    HarborName(
        SKY,
        "_exec_argv",
        "(self, command, user)",
        (K,),
        "sandbox/conformance/core.py",
        "as_user: sandbox-check runs Harbor's exact argv for a non-default user",
    ),
    HarborName(
        "harbor.verifier.verifier:Verifier",
        "_remove_reward_files",
        "(self)",
        (K,),
        PREPARATION,
        "REMOVE_REWARDS_COMMAND, skipped on a fresh dir (tests/test_transfers.py compares the two), and "
        "answered by the verifier guard's check, which empties /logs/verifier",
    ),
    # ── module-level helpers ─────────────────────────────────────────────────────────────────
    HarborName(
        "harbor.environments.skypilot", "_SANDBOX_TTL_SEC", "constant", (R,), LIFECYCLE, "the TTL Harbor asks for"
    ),
    HarborName(
        "harbor.environments.skypilot",
        "_REMOTE_TRANSFER_DIR",
        "constant",
        (R,),
        "sandbox/transfer/downloads.py",
        "Harbor's own sandbox-side staging dir for a packed download, kept so the sandbox sees Harbor's commands",
    ),
    HarborName(
        "harbor.environments.base",
        "_ENV_TRANSFER_TAR_DIR",
        "constant",
        (R,),
        "sandbox/transfer/filtered.py",
        "where Harbor's filtered download packs in the sandbox; the host-side unpack is ours",
    ),
    HarborName(
        "harbor.environments.base",
        "_TRANSFER_PACK_TIMEOUT_SEC",
        "constant",
        (R,),
        "sandbox/transfer/filtered.py",
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
    HarborName("harbor.environments.skypilot", "_sanitize_dns_name", "(value, *, max_len)", (C,), ENV, "names"),
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
        "prewarm.py",
        "groups tasks by environment the way environment_id does",
    ),
    HarborName(
        "harbor.cli.lint",
        "_selected_rules",
        "(root, cli_config)",
        (C,),
        "validate/lint.py",
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
        "prewarm.py, sandbox/conformance/environment_checks.py",
        "environments made the way a trial makes them",
    ),
    HarborName(
        "harbor.agents.factory:AgentFactory",
        "create_agent_from_config",
        "(config, logs_dir, **kwargs)",
        (C,),
        "backend/lifecycle.py",
        "the setup proof runs the trial's own agent",
    ),
    HarborName("harbor.trial.queue:TrialQueue", "submit", "(self, trial_config)", (C,), "backend/", "runs trials"),
    HarborName(
        "harbor.trial.queue:TrialQueue", "add_hook", "(self, event, callback)", (C,), "backend/, validate/", "status"
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


def surface_for(line: str = HARBOR.name) -> tuple[HarborName, ...]:
    """The entries that hold on Harbor ``line`` (the installed one by default)."""
    return tuple(entry for entry in SURFACE if line in entry.lines)
