"""The Harbor names our environment depends on (``surface.py``): ``BaseEnvironment``'s, which it
implements (construction, options, lifecycle, commands, transfers), and the parts of
``SkypilotEnvironment`` whose behaviour it keeps as a copy (its create keywords, exec argv,
image commands and pool upload): a change in one of those shapes says our copy may be stale."""

from __future__ import annotations

from osmosis_harbor.harbor_compat.names import (
    BASE,
    BOUNDS,
    ENV,
    IMAGES,
    LIFECYCLE,
    OVR,
    PREPARATION,
    SKY,
    V025,
    V026,
    C,
    HarborName,
    K,
    R,
    S,
)

__all__ = ["ENVIRONMENT_NAMES"]

CLASS = "sandbox/environment/class_facts.py"
COMMANDS = "sandbox/environment/commands.py"
SESSION = "sandbox/environment/session.py"
ROUTES = "sandbox/environment/routes.py"

ENVIRONMENT_NAMES: tuple[HarborName, ...] = (
    # ── construction: BaseEnvironment's, called; SkypilotEnvironment's keywords, taken ──────────
    HarborName(
        SKY,
        "__init__",
        "(self, environment_dir, environment_name, session_id, trial_paths, task_env_config, *, "
        "registry, pool, context_name, namespace, secrets, platform, **kwargs)",
        (K,),
        ENV,
        "ours takes the same keywords (SandboxOptions has each)",
        V025,
    ),
    HarborName(
        SKY,
        "__init__",
        "(self, *args, **kwargs)",
        (K,),
        ENV,
        "ours takes SkypilotOptions' fields (SandboxOptions has each)",
        V026,
    ),
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
        "our __init__ calls it (super()), after reading its trial context and options",
    ),
    HarborName(BASE, "_persistent_env", "attribute", (R,), ENV, "the trial's env, passed to create as Harbor does"),
    HarborName(
        BASE, "_enable_environment_dir_upload", "attribute", (R,), ENV, "Harbor's pool rule (_validate_definition)"
    ),
    HarborName(BASE, "environment_id", "cached_property", (R,), ENV, "content hash: image tags and pool groups"),
    HarborName(
        BASE,
        "_validate_definition",
        "(self)",
        (OVR,),
        ENV,
        "Harbor's SkyPilot rule for the pool claimed (a generic pool supplies the image)",
    ),
    # ── options, preflight, type and capabilities ────────────────────────────────────────────
    HarborName(
        BASE,
        "options",
        "attribute",
        (S, R),
        ENV,
        "a property of ours (SandboxOptions), set before BaseEnvironment.__init__, which keeps it and reads "
        "auto_mounting",
        V026,
    ),
    HarborName(BASE, "options_model", "constant", (OVR,), CLASS, "SandboxOptions: Harbor validates --ek with it", V026),
    HarborName(
        BASE,
        "parse_options",
        "(kwargs)",
        (OVR,),
        CLASS,
        "SandboxOptions.build: our kwargs carry Harbor's own keywords beside ours",
        V026,
    ),
    HarborName(BASE, "options_schema", "()", (C,), CLASS, "`harbor environments schema` shows SandboxOptions", V026),
    HarborName(
        BASE, "preflight", "()", (OVR,), CLASS, "the chosen SDK's check (Harbor 0.25 passes no kwargs: none)", V025
    ),
    HarborName(
        BASE, "preflight", "(kwargs)", (OVR, C), CLASS, "Harbor's options check, then the chosen SDK's check", V026
    ),
    HarborName(
        "harbor.utils.optional_import:MissingExtraError",
        "__init__",
        "(self, *, package, extra, hint)",
        (K,),
        "harbor_compat/missing_sdk.py",
        "the registry's SandboxSdkMissingError subclasses it, setting package and extra itself (its message is ours)",
    ),
    HarborName(BASE, "type", "()", (OVR,), CLASS, "SKYPILOT, as Harbor's SkyPilot class says"),
    HarborName(BASE, "resource_capabilities", "()", (OVR,), CLASS, "SkyPilot's: requests are limits"),
    HarborName(BASE, "capabilities", "property", (OVR,), CLASS, "SkyPilot's: egress blockable at create, no GPUs"),
    HarborName(SKY, "resource_capabilities", "()", (K,), CLASS, "copied"),
    HarborName(SKY, "capabilities", "property", (K,), CLASS, "copied"),
    # ── images ──────────────────────────────────────────────────────────────────────────────
    HarborName(SKY, "_image_ref", "property", (K,), IMAGES, "its 'needs a registry' words; our refs are per content"),
    HarborName(SKY, "_image_exists", "(self)", (K,), IMAGES, "`docker manifest inspect`, for want of docker-py"),
    HarborName(
        SKY,
        "_build_and_push_image",
        "(self)",
        (K,),
        IMAGES,
        "its two commands and their RuntimeError words, one attempt per attempt of our retry (which knows a "
        "missing base); without a registry: built locally, never pushed",
    ),
    # ── sandbox lifecycle ────────────────────────────────────────────────────────────────────
    HarborName(BASE, "start", "(self, force_build)", (OVR,), ENV, "image, create or claim, mount targets, upload"),
    HarborName(SKY, "start", "(self, force_build)", (K,), ENV, "its order of steps"),
    HarborName(BASE, "_mount_targets", "(self, *, writable_only)", (C,), ENV, "made at the start, as Harbor's are"),
    HarborName(
        SKY,
        "_create_sandbox",
        "(self, image)",
        (K,),
        LIFECYCLE,
        "a copy of its two create calls over the chosen SDK, plus host networking and no sandbox left by a "
        "cancellation (tests/unit/sandbox/test_skypilot_call_shapes.py compares the keywords)",
    ),
    HarborName(
        BASE,
        "_upload_environment_dir_after_start",
        "(self)",
        (OVR, C),
        ENV,
        "a generic pool's image gets environment/ (SkyPilot's rule); a group pool's and a plain create's: Harbor's base",
    ),
    HarborName(SKY, "_upload_environment_dir_after_start", "(self)", (K,), ENV, "its generic-pool rule"),
    HarborName(BASE, "stop", "(self, delete)", (OVR,), ENV, "drops staged uploads; terminates through the owner"),
    HarborName(SKY, "stop", "(self, delete)", (K,), ENV, "terminated whatever delete says; an error logged"),
    HarborName(BASE, "_effective_cpus", "property", (OVR, R), f"{ENV}, {BOUNDS}", "Harbor's documented default sizing"),
    HarborName(
        BASE, "_effective_memory_mb", "property", (OVR, R), f"{ENV}, {BOUNDS}", "Harbor's documented default sizing"
    ),
    HarborName(BASE, "_network_disabled", "property", (R,), ENV, "block_network, pool shape, host networking"),
    # ── commands and transfers ───────────────────────────────────────────────────────────────
    HarborName(BASE, "exec", "(self, command, cwd, env, timeout_sec, user)", (OVR,), ENV, "the command pipeline"),
    HarborName(
        SKY,
        "exec",
        "(self, command, cwd, env, timeout_sec, user)",
        (K,),
        ENV,
        "its argv, merged env, effective workdir and the 3600 s cap",
    ),
    HarborName(
        SKY,
        "_exec_argv",
        "(self, command, user)",
        (K,),
        f"{COMMANDS}, sandbox/conformance/core.py",
        "bash -c, or su for another user (sandbox-check's as_user runs the same argv)",
    ),
    HarborName(SKY, "_dispatch_exec", "(self, argv, *, workdir, timeout_seconds, env)", (K,), SESSION, "the SDK call"),
    HarborName(SKY, "_drain_stream", "(stream)", (K,), SESSION, "a handle's stream as Harbor reads it"),
    HarborName(SKY, "_run_shell", "(self, command, *, timeout_seconds)", (K,), COMMANDS, "sh -c, no workdir"),
    HarborName(SKY, "upload_dir", "(self, source_dir, target_dir)", (K,), ROUTES, "one tar written, one unpack"),
    HarborName(BASE, "upload_dir", "(self, source_dir, target_dir)", (OVR,), ENV, "the transfer router"),
    HarborName(BASE, "upload_file", "(self, source_path, target_path)", (OVR,), ENV, "the transfer router"),
    HarborName(BASE, "download_dir", "(self, source_dir, target_dir)", (OVR,), ENV, "the transfer router"),
    HarborName(BASE, "download_file", "(self, source_path, target_path)", (OVR,), ENV, "the transfer router"),
    HarborName(BASE, "is_dir", "(self, path, user)", (OVR, C), ENV, "answered from an archive snapshot"),
    HarborName(BASE, "is_file", "(self, path, user)", (OVR, C), ENV, "answered from an archive snapshot"),
    HarborName(
        BASE, "ensure_dirs", "(self, dirs, *, chmod)", (OVR, C), PREPARATION, "no-op on a known-fresh baked sandbox"
    ),
    HarborName(
        BASE, "empty_dirs", "(self, dirs, *, chmod)", (OVR, C), PREPARATION, "no-op on a known-fresh baked sandbox"
    ),
    HarborName(BASE, "_resolve_user", "(self, user)", (C,), ENV, "which preparation commands run as root"),
    HarborName(BASE, "_merge_env", "(self, env)", (C,), ENV, "an exec's env; a head start's early command's"),
    HarborName(
        BASE,
        "_empty_dirs_command",
        "(self, dirs, *, chmod)",
        (C,),
        ENV,
        "staged with an upload; a head start (own_sandbox.py) empties the agent's workdir with it, early",
    ),
    HarborName(BASE, "_reset_dirs_user", "(self)", (C,), ENV, "the user Harbor's empty_dirs runs as"),
    HarborName(
        "harbor.verifier.verifier:Verifier",
        "_remove_reward_files",
        "(self)",
        (K,),
        PREPARATION,
        "REMOVE_REWARDS_COMMAND, skipped on a fresh dir (tests/e2e/transfer/test_archives.py compares the two), and "
        "answered by the verifier guard's check, which empties /logs/verifier",
    ),
)
