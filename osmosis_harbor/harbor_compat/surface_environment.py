"""The Harbor names our environment depends on: ``SkypilotEnvironment``'s and ``BaseEnvironment``'s
construction, options, images, sandbox lifecycle, commands and transfers (``surface.py``)."""

from __future__ import annotations

from osmosis_harbor.harbor_compat.names import (
    BASE,
    BOUNDS,
    ENV,
    EXEC_RECORDS,
    GUARD,
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
    attribute_we_set,
)

__all__ = ["ENVIRONMENT_NAMES"]

ENVIRONMENT_NAMES: tuple[HarborName, ...] = (
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
    attribute_we_set(
        "_pool", "the pool a launch claims from; Harbor's _validate_definition reads it during init", V025
    ),
    attribute_we_set("_registry", "where images are pushed (Harbor's _image_ref and ours)"),
    attribute_we_set("_context_name", "passed to create"),
    attribute_we_set("_namespace", "passed to create"),
    attribute_we_set("_secrets", "passed to create"),
    attribute_we_set("_platform", "the build platform"),
    attribute_we_set("_sandbox", "the live handle every Harbor method uses (_require_sandbox, stop)"),
    attribute_we_set("_workdir", "the Dockerfile's WORKDIR, Harbor's exec cwd fallback"),
    attribute_we_set("_sandbox_name", "the DNS-1123 sandbox name"),
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
    HarborName(SKY, "_dockerfile_path", "property", (R,), ENV, "what is built, and the baked-bundle marker"),
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
        ENV,
        "a group pool's image holds environment/ already; a generic pool gets Harbor's upload",
    ),
    HarborName(BASE, "_upload_environment_dir_after_start", "(self)", (C,), ENV, "what a plain start uploads"),
    HarborName(
        SKY,
        "_terminate_sandbox",
        "(self)",
        (OVR, C),
        LIFECYCLE,
        "through the owner's registry, deferred off the trial's path",
    ),
    HarborName(
        SKY,
        "_require_sandbox",
        "(self)",
        (C,),
        ENV,
        "the live handle, or Harbor's error (exec records read through it)",
    ),
    HarborName(
        SKY, "stop", "(self, delete)", (OVR, C), ENV, "drops staged uploads; a self-owned environment closes its owner"
    ),
    HarborName(BASE, "_effective_cpus", "property", (OVR, R), f"{ENV}, {BOUNDS}", "Harbor's documented default sizing"),
    HarborName(
        BASE, "_effective_memory_mb", "property", (OVR, R), f"{ENV}, {BOUNDS}", "Harbor's documented default sizing"
    ),
    HarborName(BASE, "_network_disabled", "property", (R,), ENV, "block_network, pool shape, host networking"),
    # ── commands and transfers ───────────────────────────────────────────────────────────────
    HarborName(SKY, "exec", "(self, command, cwd, env, timeout_sec, user)", (OVR, C), ENV, "lost sandboxes; flushes"),
    HarborName(SKY, "_run_shell", "(self, command, *, timeout_seconds)", (OVR, C), ENV, "lost sandboxes; flushes"),
    HarborName(
        SKY,
        "_dispatch_exec",
        "(self, argv, *, workdir, timeout_seconds, env)",
        (OVR, C),
        f"{ENV}, {EXEC_RECORDS}, {GUARD}",
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
    HarborName(BASE, "_merge_env", "(self, env)", (C,), ENV, "a head start's early command gets Harbor's env"),
    HarborName(
        BASE,
        "_empty_dirs_command",
        "(self, dirs, *, chmod)",
        (C,),
        ENV,
        "a head start (own_sandbox.py) empties the agent's workdir with Harbor's own command, early",
    ),
    HarborName(BASE, "_reset_dirs_user", "(self)", (C,), ENV, "the user Harbor's empty_dirs runs as"),
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
        "REMOVE_REWARDS_COMMAND, skipped on a fresh dir (tests/e2e/transfer/test_archives.py compares the two), and "
        "answered by the verifier guard's check, which empties /logs/verifier",
    ),
)
