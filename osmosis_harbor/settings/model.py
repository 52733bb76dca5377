"""The settings model: every knob osmosis-harbor reads from the host environment, one field each.

The README's "Settings" table documents each field. Names are prefixed ``OSMOSIS_HARBOR_``; the
few that belong to other tools keep those tools' names (``HARBOR_SKYPILOT_REGISTRY``,
``DOCKER_HOST``, ``XDG_CACHE_HOME``, ``SKYPILOT_API_SERVER_ENDPOINT``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_DOCKER_HOST", "MIB", "Settings"]

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
MIB = 1024 * 1024


class Settings(BaseSettings):
    """The host-side settings (see the README's "Settings" table)."""

    model_config = SettingsConfigDict(env_prefix="OSMOSIS_HARBOR_", extra="ignore", frozen=True, env_ignore_empty=True)

    bundles: Path | None = Field(
        None, description="the bundle wheel cache (default $XDG_CACHE_HOME/osmosis-harbor/bundles)"
    )
    lock_dir: Path | None = Field(None, description="pool lock files (default $XDG_CACHE_HOME/osmosis-harbor/locks)")
    keep_home: bool = Field(False, description="`rollout` keeps the osmosis server's trajectories in ~/.osmosis")
    registry: str | None = Field(
        None,
        validation_alias=AliasChoices("OSMOSIS_HARBOR_REGISTRY", "HARBOR_SKYPILOT_REGISTRY"),
        description="the registry task images are pushed to when none is passed",
    )
    docker_host: str = Field(
        DEFAULT_DOCKER_HOST,
        validation_alias="DOCKER_HOST",
        description="the Docker engine (read by the docker SDK itself too)",
    )
    xdg_cache_home: Path | None = Field(None, validation_alias="XDG_CACHE_HOME")
    skypilot_api_server_endpoint: str | None = Field(
        None,
        validation_alias="SKYPILOT_API_SERVER_ENDPOINT",
        description='sdk="skypilot": the SkyPilot API server (SkyPilot\'s own variable; else `sky api login`)',
    )
    columns: int | None = Field(None, validation_alias="COLUMNS", description="result tables' width off a terminal")
    rollout_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        validation_alias="_OSMOSIS_ROLLOUT_PORT",
        description="the port serve() listens on by default (osmosis-ai's harness sets it; else 8000)",
    )
    task_roots: str | None = Field(
        None, description="directories (os.pathsep-separated) a request's local harbor_task may name besides tasks_dir"
    )
    allow_local_git: bool = Field(False, description="requests may name file:// and bare-path git repositories")
    allow_private_git_hosts: bool = Field(
        False, description="requests' git_url may name hosts that are (or resolve to) loopback or private addresses"
    )
    # Files a sandbox wrote, read on the host (osmosis_harbor.trials.contract_files): per-kind size bounds.
    max_sample_bytes: int = Field(32 * 2**20, gt=0, description="bound on a sample.json read from a trial")
    max_error_bytes: int = Field(2**20, gt=0, description="bound on an error.json read from a trial")
    max_reward_bytes: int = Field(64 * 2**10, gt=0, description="bound on a reward file or exit code read by the host")
    max_trajectory_bytes: int = Field(64 * 2**20, gt=0, description="bound on a native agent's trajectory.json")
    max_json_depth: int = Field(
        100, gt=0, le=500, description="nesting bound on JSON read from a trial (deeper: a validation_error)"
    )
    emulator_url: str | None = Field(
        None, description="the skypilot-emulator server to use (default: start or reuse one on this machine)"
    )
    emulator_timeout: float = Field(120.0, gt=0, description="seconds a skypilot-emulator API call may take")
    emulator_retries: int = Field(3, ge=0, description="retries of an API call the emulator answered 503 or 429")
    claim_batch_window_ms: float = Field(
        30.0, ge=0, description="pool claims of one group made within this window go out in one call (0: never batch)"
    )
    claim_batch_max: int = Field(64, ge=1, description="at most this many pool claims in one batch call")
    pool_claim_wait_sec: float = Field(
        5.0,
        ge=0,
        description="a claim its pool cannot serve (no ready member) is tried again this long, then the "
        "sandbox is cold-created from the pool's image",
    )
    pool_min: int = Field(1, ge=0, description='pool_size="auto": the fewest members a pool keeps')
    pool_max: int = Field(32, ge=1, description='pool_size="auto": the most members a pool grows to')
    pool_idle_sec: float = Field(
        120.0, gt=0, description='pool_size="auto": no claim this long shrinks a pool to pool_min'
    )
    pool_autoscale_interval_sec: float = Field(5.0, gt=0, description='pool_size="auto": how often pools are resized')
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="worker processes a HarborBackend runs its trials in when workers= is not passed (1: in the "
        "server's own process)",
    )
    harbor_fastpaths: bool = Field(
        True,
        description="Harbor's per-trial task checks run in their faster, equivalent form (harbor_compat/fastpaths.py)",
    )
    relay_max_request_bytes: int = Field(
        32 * 2**20, gt=0, description="the policy relay refuses a sandbox's request body over this (413)"
    )
    relay_max_response_bytes: int = Field(
        64 * 2**20, gt=0, description="the policy relay cuts off a policy response over this"
    )
    relay_timeout_sec: float = Field(
        900.0,
        gt=0,
        description="the policy relay's wait for the policy endpoint (outlasting it while the endpoint answers others: the call's fault)",
    )
    relay_max_connections: int = Field(
        1024, gt=0, description="connections the policy relay holds at once, from all sandboxes together"
    )
    relay_reserved_connections: int = Field(
        128,
        ge=0,
        description="the last of relay_max_connections, kept for sandboxes holding fewer than 4 connections",
    )
    relay_max_source_connections: int = Field(
        32, gt=0, description="connections one sandbox (source address) may hold, counted before their headers"
    )
    relay_max_token_calls: int = Field(16, gt=0, description="calls one rollout may have in flight through the relay")
    relay_max_buffered_bytes: int = Field(
        256 * MIB, gt=0, description="request bodies the policy relay holds at once, all rollouts together"
    )
    relay_max_token_buffered_bytes: int = Field(
        64 * MIB,
        gt=0,
        description="request bodies one rollout's calls may hold at once; also the reserve kept for rollouts "
        "holding none",
    )
    relay_header_timeout_sec: float = Field(
        10.0, gt=0, description="a request's head must reach the relay within this (from connect or the last answer)"
    )
    relay_body_timeout_sec: float = Field(
        30.0, gt=0, description="a request's body must reach the relay within this after its head"
    )
    relay_port: int = Field(
        0, ge=0, le=65535, description="the policy relay's port on the sandboxes' gateway (0: an ephemeral one)"
    )
    # Bounds on what one transfer out of a sandbox may bring to the host (``sandbox/extract``).
    transfer_max_bytes: int = Field(256 * MIB, gt=0, description="file bytes per transfer out of a sandbox")
    transfer_max_file_bytes: int = Field(64 * MIB, gt=0, description="bytes per file in a transfer out of a sandbox")
    transfer_max_files: int = Field(50_000, gt=0, description="entries (files, dirs, links) per transfer")
    transfer_max_depth: int = Field(64, gt=0, description="path components per entry of a transfer")
    transfer_max_path_bytes: int = Field(1024, gt=0, description="bytes per entry's path in a transfer")
    export_max_bytes: int = Field(
        256 * MIB, gt=0, description="file bytes a rollout's artifacts and trial logs may bring to the artifact root"
    )
    export_max_files: int = Field(10_000, gt=0, description="files a rollout's export to the artifact root may copy")
    exec_output_max_bytes: int = Field(
        4 * MIB, gt=0, description="per stream, the tail of a command's stdout/stderr the Docker SDK keeps"
    )
    docker_sdk_threads: int = Field(
        1024,
        gt=0,
        description="threads of the local Docker SDK; each running exec holds one (bounds rollouts in flight)",
    )
    lean_engine_client: bool = Field(
        True,
        description="the Docker engine's plain JSON requests go over http.client with one kept connection per "
        "thread, an exec's output and archive reads on a connection of their own (sandbox/docker/lean_http.py); "
        "off: docker-py's requests transport for all",
    )
    sandbox_no_new_privileges: bool = Field(
        True,
        description="local sandboxes run with no-new-privileges: setuid binaries (sudo, su) cannot raise a "
        "non-root agent user to root (off: for a task whose agent user relies on sudo)",
    )
    sandbox_disk_mb: int = Field(
        10240,
        ge=0,
        description="the writable layer of a local sandbox (everything but /tmp); past it the sandbox is "
        "evicted and the rollout ends agent_error; also each file's size limit there, so one write or "
        "preallocation stops at it (0: unbounded)",
    )
    sandbox_seccomp_profile: Path | None = Field(
        None,
        description="a seccomp profile (Docker's JSON format) for local sandboxes in place of the engine's "
        "default; `python -m osmosis_harbor seccomp-profile` makes one from Docker's default.json that also "
        "refuses fallocate --keep-size, which the file size limit cannot see (None: the engine's default)",
    )
    sandbox_inodes: int = Field(
        500_000,
        ge=0,
        description="files, directories and links in the writable layer of a local sandbox (the host "
        "filesystem's inodes); past it the sandbox is evicted and the rollout ends agent_error (0: unbounded)",
    )
    ledger: Path | None = Field(
        None, description="the sandbox ledger (default $XDG_CACHE_HOME/osmosis-harbor/ledger.sqlite3)"
    )
    api_attempts: int = Field(
        5, ge=1, description="attempts of a sandbox API call that is safe to retry (api_faults.CALL_SAFETY)"
    )
    api_retry_max_wait: float = Field(5.0, gt=0, description="longest wait, in seconds, between two such attempts")
    verifier_head_start: bool = Field(
        True,
        description="a graded rollout's separate verifier sandbox is created while the agent runs (not from a pool)",
    )
    exec_archives: bool = Field(
        True,
        description="directories move as one tar through a file write or read plus one command, folded into the "
        "commands they precede and follow, with write-behind uploads and one /logs snapshot "
        "(sandbox/transfer/exec_archives.py, exec_folds.py): SkyPilot's path, on every SDK; off: Harbor's own "
        "transfer commands",
    )
    verifier_guard: bool = Field(
        True,
        description="a task's own tests that run in the agent's sandbox (Harbor's shared verifier) run under the "
        "verifier guard (osmosis_harbor/sandbox/guard): the agent's processes marked, ended before the tests, the "
        "toolchain compared with its record; off: such verifiers run unguarded, as in Harbor",
    )
    allow_shared_verifier_with_shell_exec: bool = Field(
        False,
        description="run a root agent's rollouts whose tests share its sandbox on an SDK whose exec starts a shell "
        "of the sandbox (skypilot, skypilot-emulator: sh -c, sh found on the pod's PATH), which the verifier guard "
        "cannot protect (a planted sh runs unmarked first); off: such rollouts are refused as validation_error",
    )
    fresh_verifier: bool = Field(
        True,
        description="a single-step task's own tests run in a fresh sandbox of the task's image, the agent's work "
        "carried over as data (tasks/verification.py); off: they run in the agent's sandbox (shared, under the "
        "verifier guard)",
    )
    verifier_allowances: Path | None = Field(
        None,
        description="where validate's oracle runs record what real solutions change (default "
        "$XDG_CACHE_HOME/osmosis-harbor/verifier-allowances)",
    )
    verifier_guard_timeout_sec: float = Field(
        300.0, gt=0, le=3600, description="the longest one of the verifier guard's own commands may run"
    )

    # The leak audit (osmosis_harbor/audit): its bounds, and whether training admits leaking tasks.
    audit_timeout_sec: float = Field(
        300.0, gt=0, le=3600, description="the longest one environment's leak audit may take (then: audit-incomplete)"
    )
    audit_max_git_bytes: int = Field(
        64 * MIB, gt=0, description="a .git directory larger than this is not copied out for the audit (reported)"
    )
    audit_max_git_files: int = Field(
        20_000, gt=0, description="a .git directory with more entries than this is not copied out (reported)"
    )
    audit_max_objects: int = Field(
        200_000, gt=0, description="git objects the audit reads per repository before it stops (reported)"
    )
    audit_max_repos: int = Field(16, gt=0, description="git repositories the audit reads per sandbox")
    audit_max_hashed: int = Field(
        2000, gt=0, description="files the audit hashes (or finds containing a line) per sandbox"
    )
    allow_leaking_tasks: bool = Field(
        False,
        description="HarborBackend admits dataset tasks whose leak audit found an error (history beyond HEAD, "
        "a copy of the tests' expected output); off: they end validation_error",
    )

    def user_cache(self) -> Path:
        """Our directory in the user cache (``$XDG_CACHE_HOME`` or ``~/.cache``): machine-local
        state every process of this user shares, never the working directory."""
        return (self.xdg_cache_home or Path.home() / ".cache") / "osmosis-harbor"

    def pool_lock_dir(self) -> Path:
        """Lock files live in the user cache dir: machine-local, like the engine they guard."""
        if self.lock_dir is not None:
            return self.lock_dir
        return self.user_cache() / "locks"

    def image_tmp_dir(self) -> Path:
        """What each image holds in /tmp, by image id: machine-local, read once per image."""
        return self.user_cache() / "image-tmp"

    def task_root_paths(self) -> tuple[Path, ...]:
        """``OSMOSIS_HARBOR_TASK_ROOTS`` split like ``PATH`` (empty entries ignored)."""
        return tuple(Path(p) for p in (self.task_roots or "").split(os.pathsep) if p)

    def emulator_dir(self) -> Path:
        """Where an on-demand skypilot-emulator server keeps its state file, lock and log."""
        return self.user_cache() / "emulator"

    def ledger_path(self) -> Path:
        """The sandbox ledger: machine-local, shared by every process of this user."""
        if self.ledger is not None:
            return self.ledger
        return self.user_cache() / "ledger.sqlite3"

    def verifier_allowances_dir(self) -> Path:
        """What validate's oracle runs recorded real solutions changing, per task content."""
        if self.verifier_allowances is not None:
            return self.verifier_allowances
        return self.user_cache() / "verifier-allowances"

    def bundle_cache(self) -> Path:
        """The user cache, never the working directory: a run inside a project must not change
        the project's files (a harness digests them to decide whether a run may resume)."""
        if self.bundles is not None:
            return self.bundles
        return self.user_cache() / "bundles"
