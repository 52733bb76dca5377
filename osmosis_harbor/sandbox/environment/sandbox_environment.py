"""Harbor environment for SkyPilot sandboxes, with the SDK chosen per environment.

It subclasses Harbor's ``SkypilotEnvironment`` so that trials take the code path they take in
production. The class itself takes the SDK as a kwarg (``sdk="skypilot"`` or ``"docker"``)
instead of Harbor's import-time module global, reads ``pool`` as a base name (a task claims its
environment group's pool), accepts ``host_network=True`` for the Docker SDK only, and routes
files as archives: over the handle's archive calls when it has them, else over one file call
plus one command, with what comes back extracted by our own code, never ``tarfile``.

Each other concern is a mixin that says its own part:

* ``environment/images.py`` (``ImageResolution``): image reference, existence, build, push;
* ``environment/own_sandbox.py`` (``SandboxLifecycle``): create, claim, stop, terminate;
* ``sdk/bounds.py`` (``DefaultBounds``): Harbor's documented default sizing;
* ``environment/loss_detection.py`` (``LossDetection``): lost sandboxes, not failed commands;
* ``environment/preparation.py`` (``PreparationElisions``): preparation skipped on fresh dirs;
* ``environment/exec_records.py`` (``ExecRecords``): a result re-read after an API fault;
* ``environment/verifier_guard.py`` (``GuardedExecs``): the verifier guard's commands;
* ``transfer/filtered.py`` (``FilteredDownloads``): downloads with exclusions.

Every Harbor name this touches is listed, with why, in ``harbor_compat/surface.py``.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO, cast, override

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.definition import (
    has_agent_environment_definition,
    parse_dockerfile_workdir,
    require_agent_environment_definition,
)
from harbor.environments.skypilot import _REMOTE_TRANSFER_DIR, SkypilotEnvironment, _sanitize_dns_name
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor import settings
from osmosis_harbor.errors import SandboxDiskBoundError, SandboxLostError
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox.environment.exec_records import ExecRecords
from osmosis_harbor.sandbox.environment.images import ImageResolution, declares_baked_layout
from osmosis_harbor.sandbox.environment.loss_detection import LossDetection
from osmosis_harbor.sandbox.environment.own_sandbox import SandboxLifecycle
from osmosis_harbor.sandbox.environment.preparation import REMOVE_REWARDS_COMMAND, PreparationElisions
from osmosis_harbor.sandbox.environment.verifier_guard import GuardedExecs, baked_guard
from osmosis_harbor.sandbox.guard.session import current_guard
from osmosis_harbor.sandbox.options import DEFAULT_PLATFORM, IMPORT_PATH, SandboxOptions
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_if_any
from osmosis_harbor.sandbox.owner.pools import environment_group_key, pool_name_for
from osmosis_harbor.sandbox.sdk.bounds import DefaultBounds
from osmosis_harbor.sandbox.sdk.errors import is_missing
from osmosis_harbor.sandbox.sdk.faults import retry_safe
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk, has_archives
from osmosis_harbor.sandbox.sdk.registry import DEFAULT_SDK
from osmosis_harbor.sandbox.transfer.archives import ArchiveTransfers
from osmosis_harbor.sandbox.transfer.downloads import HarborPath, fetch_archive
from osmosis_harbor.sandbox.transfer.exec_archives import ExecArchives
from osmosis_harbor.sandbox.transfer.filtered import FilteredDownloads

__all__ = [
    "IMPORT_PATH",
    "REMOVE_REWARDS_COMMAND",
    "SandboxEnvironment",
    "declares_baked_layout",
    "environment_group_key",
    "pool_name_for",
]


class SandboxEnvironment(
    FilteredDownloads,
    PreparationElisions,
    LossDetection,
    SandboxLifecycle,
    ImageResolution,
    DefaultBounds,
    ExecRecords,
    GuardedExecs,
    SkypilotEnvironment,
):
    """Harbor's SkyPilot sandbox environment over a selectable ``sky.sandbox`` SDK."""

    # Harbor 0.26 validates a run's kwargs (``--ek``) and shows `harbor environments schema`
    # through this model; 0.25 has no options model and ignores it.
    options_model = SandboxOptions

    @classmethod
    def parse_options(cls, kwargs: dict[str, Any] | None = None) -> SandboxOptions:
        """The kwargs as our options (`ConfigError`, a ValueError, naming what is wrong): they
        carry Harbor's own keywords beside ours, which Harbor's model check would refuse."""
        return SandboxOptions.build(**(kwargs or {}))

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        """Before Harbor queues trials: the kwargs are valid, and the chosen SDK has what it
        needs here (``SandboxImplementation.preflight``), exiting with the way out if not.
        Harbor's ``SkypilotEnvironment.preflight`` is not run: it requires ``sky.sandbox``
        whatever the SDK. Harbor 0.25 passes no kwargs, so which SDK is chosen is unknown
        here and nothing is checked (a missing SDK still fails the trial, by name)."""
        error_policies.install()  # before Harbor's job runs a trial: our errors' policies
        if HARBOR.options_model:
            cast(Any, super(SkypilotEnvironment, cls)).preflight(kwargs)  # Harbor's base: parse_options
        if kwargs is not None:
            cls.parse_options(kwargs).impl.preflight()

    @override
    def _validate_definition(self) -> None:
        """Harbor's rule, for the pool this environment claims: a generic pool supplies the
        image, so no definition is needed; a group pool's image is this environment's own,
        so the task's definition is (Harbor 0.26 reads its options' pool, our base name)."""
        if self._pool:
            if not self._enable_environment_dir_upload:
                raise ValueError(
                    "SkyPilot warm pools do not support dedicated verifier images or build definitions "
                    "because the pool supplies its own image. Remove the 'pool' environment kwarg to use "
                    "the verifier image or build definition."
                )
            return
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: TaskEnvironmentConfig,
        *,
        sdk: str = DEFAULT_SDK,
        host_network: bool = False,
        pool_size: int | str | None = None,
        registry: str | None = None,
        pool: str | None = None,
        context_name: str | None = None,
        namespace: str | None = None,
        secrets: list[str] | None = None,
        platform: str = DEFAULT_PLATFORM,
        auto_mounting: bool = False,
        **kwargs: Any,
    ) -> None:
        error_policies.install()  # a trial of ours classifies its errors by our policies (idempotent)
        # Harbor passes our config's kwargs and its own keywords in one call: ours are named
        # above, checked once here (SandboxOptions), and Harbor's go on to BaseEnvironment.
        options = SandboxOptions.build(
            sdk=sdk,
            host_network=host_network,
            pool_size=pool_size,
            registry=registry,
            pool=pool or None,
            context_name=context_name,
            namespace=namespace,
            secrets=secrets,
            platform=platform,
            auto_mounting=auto_mounting,
        )
        self._options = options
        self._sdk_name = options.sdk
        self._impl = options.impl
        self._sdk: SandboxSdk = self._impl.load()
        self._host_network = options.host_network
        # The attributes SkypilotEnvironment.__init__ sets (``harbor_compat/surface.py``, use "set").
        # Its own __init__ refuses to run unless Harbor imported sky.sandbox at import time; the
        # SDK is ours to choose, so we set them here and go straight to BaseEnvironment.__init__.
        self._pool_base = options.pool
        # A task with no environment definition (no Dockerfile, no docker_image) runs, as in
        # Harbor, from a named pool whose image is generic (SkyPilot's built-in ``default``):
        # claimed by its own name, set before Harbor's _validate_definition reads it. Any other
        # task's pool is its environment group's, derived below once the environment is known.
        self._generic_pool = bool(options.pool) and not has_agent_environment_definition(
            environment_dir, docker_image=task_env_config.docker_image
        )
        self._pool: str | None = options.pool if self._generic_pool else None
        self._registry = options.registry or settings.current().registry or self._impl.default_registry
        self._context_name = options.context_name
        self._namespace = options.namespace
        self._secrets = list(options.secrets) if options.secrets else None
        self._platform = options.platform
        self._sandbox: Any | None = None
        self._stopping = False  # set once this trial stops the sandbox itself
        self._lost: SandboxLostError | None = None
        self._evicted: SandboxDiskBoundError | None = None  # past its disk bound (loss_detection.py)
        self._records_exec_results = options.impl.records_exec_results  # exec_records.py
        self._records_read: list[str] = []
        self._archive_transfers: ArchiveTransfers | None = None
        self._known_ready: set[str] = set()  # dirs known to exist, empty and 0777 (see _skippable)
        self._scope: list[str] | None = None  # the paths the running preparation command touches
        # Whoever submitted this trial owns its sandboxes (a backend, a validation run); made by
        # Harbor's own CLI outside every owner, the environment owns itself (closed at stop).
        submitter = owner_if_any()
        self._owner = submitter or SandboxOwner.make(f"environment {session_id}")
        self._owns_itself = submitter is None
        self._sandboxes = self._owner.sandboxes
        self._guard = None
        # Harbor 0.26's __init__ takes ``self.options`` as set (it is, above) and reads it.
        BaseEnvironment.__init__(
            self,
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            auto_mounting=options.auto_mounting,
            **kwargs,
        )
        self._workdir = parse_dockerfile_workdir(self._dockerfile_path)
        self._baked_layout = declares_baked_layout(self._dockerfile_path) and not (
            self.task_env_config.docker_image and not self._dockerfile_path.is_file()
        )
        self._sandbox_name = _sanitize_dns_name(f"hb-{session_id}")
        # The verifier guard of the trial, for its agent's sandbox (a separate verifier's needs none).
        self._guard = current_guard() if self.loss_role == "agent" else None
        self._guard_baked = baked_guard(self._dockerfile_path) if self._guard is not None else None
        if self._pool_base and not self._generic_pool:
            self._pool = pool_name_for(self._pool_base, self.group_key)

    @property
    def group_key(self) -> str:
        """The environment group this sandbox belongs to (see ``environment_group_key``)."""
        # The task's declared network mode, not the runtime policy Harbor derives per role
        # and phase: prewarm and every trial of the task read the same declaration.
        no_network = self.task_env_config.network_mode == NetworkMode.NO_NETWORK
        return environment_group_key(self.environment_id, self._effective_cpus, self._effective_memory_mb, no_network)

    def pool_shape(self) -> dict[str, Any]:
        """What a warm pool of this environment's group is created with, besides its image."""
        memory_mb = self._effective_memory_mb
        shape: dict[str, Any] = {
            "cpus": self._effective_cpus,
            "memory_gb": memory_mb / 1024 if memory_mb else None,
            "block_network": self._network_disabled,
        }
        if self.uses_host_network:
            shape["host_network"] = True
        return shape

    @property
    def pool_name(self) -> str | None:
        """The warm pool this environment claims from, if it was given a pool base name."""
        return self._pool

    @property
    def options(self) -> SandboxOptions:
        """The sandbox options this environment was made with."""
        return self._options

    @property
    def sdk_name(self) -> str:
        return self._sdk_name

    @property
    def sandbox_name(self) -> str:
        return self._sandbox_name

    # ── commands ──────────────────────────────────────────────────────────────
    # Every command and transfer goes through `_guarded` (``loss_detection.py``): a failure
    # asks the SDK whether the sandbox is still there.

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if await self._guard_took(command, self._resolve_user(user)):
            return ExecResult(stdout="", stderr="", return_code=0)
        if self._skip_preparation(command, self._resolve_user(user)):
            return ExecResult(stdout="", stderr="", return_code=0)
        async with self._command():
            return await self._guarded(super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user))

    @override
    async def _run_shell(self, command: str, *, timeout_seconds: int) -> ExecResult:
        async with self._command():
            return await self._guarded(super()._run_shell(command, timeout_seconds=timeout_seconds))

    @contextlib.asynccontextmanager
    async def _command(self) -> AsyncIterator[None]:
        """A command sees every upload made before it, and may change anything it can reach;
        Harbor's preparation commands (``_prepare``) touch only their own paths."""
        scope, transfers = self._scope, self._archive_transfers
        self._forget_ready(scope)
        if transfers is None:
            yield
            return
        await (transfers.flush() if scope is None else transfers.flush_overlapping(scope))
        transfers.command_ran(scope)
        try:
            yield
        finally:
            transfers.command_ran(scope)

    @override
    async def _write_remote_bytes(self, data: bytes, remote_path: str) -> None:
        await self._guarded(retry_safe("write_bytes", super()._write_remote_bytes, data, remote_path))

    @override
    async def _read_remote_bytes(self, remote_path: str) -> bytes:
        """A file's bytes; a missing file is ``FileNotFoundError`` whatever the SDK's shape of
        "not found" (SkyPilot's is a status, not a builtin), once the sandbox is known alive."""
        try:
            return await self._guarded(retry_safe("read_bytes", super()._read_remote_bytes, remote_path))
        except SandboxLostError:
            raise
        except Exception as exc:
            if is_missing(exc) and not isinstance(exc, FileNotFoundError):
                raise FileNotFoundError(errno.ENOENT, f"no such file in the sandbox ({exc})", remote_path) from exc
            raise

    # ── transfers (archive capability) ────────────────────────────────────────
    # Overridden to take the archive path: the handle's own archive calls (the Docker SDK), or
    # archives made of SkyPilot's calls (``exec_archives.py``); with ``exec_archives`` off, an
    # SDK without archive calls runs Harbor's own transfer commands.

    def _archives(self) -> ArchiveTransfers | None:
        """The archive transfers of this sandbox: over its handle's archive calls when it offers
        them, else built from a file write or read plus one command (``exec_archives.py``)
        unless ``exec_archives`` is off (then None: Harbor's own transfer commands run)."""
        if self._archive_transfers is not None or self._sandbox is None:
            return self._archive_transfers
        if has_archives(self._sandbox):
            sandbox = self._sandbox

            async def put(data: bytes, path: str) -> None:
                await self._guarded(sandbox.put_archive.aio(data, path))

            async def get(path: str, into: BinaryIO) -> None:
                await self._guarded(fetch_archive(sandbox, path, into))

            self._archive_transfers = ArchiveTransfers(put, get, self.logger)
        elif settings.current().exec_archives:
            archives = ExecArchives(self._raw_shell, self._write_remote_bytes, self._read_remote_bytes)
            self._archive_transfers = ArchiveTransfers(archives.put, archives.get, self.logger)
        return self._archive_transfers

    async def _raw_shell(self, command: str, timeout_seconds: int) -> ExecResult:
        """A command of the transfers themselves: guarded, but neither flushing the staged
        uploads nor invalidating snapshots, as every other command does (``_command``)."""
        return await self._guarded(SkypilotEnvironment._run_shell(self, command, timeout_seconds=timeout_seconds))

    # On Harbor's path a transfer is commands in the sandbox; each touches only the transfer's
    # target and its temp archive under Harbor's transfer dir, so it makes only those unknown
    # (``preparation.py``), not every dir known ready: a later preparation there stays elided.

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        self._forget_ready([target_dir])
        if (transfers := self._archives()) is None:
            with self._prepare([target_dir, _REMOTE_TRANSFER_DIR]):
                return await super().upload_dir(source_dir, target_dir)
        transfers.stage_dir(Path(source_dir), target_dir)

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self._forget_ready([target_path])
        if (transfers := self._archives()) is None:
            return await super().upload_file(source_path, target_path)
        transfers.stage_file(Path(source_path), target_path)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        if (transfers := self._archives()) is None:
            with self._prepare([_REMOTE_TRANSFER_DIR]):
                await self._harbor_path().download_dir(source_dir, Path(target_dir))
            return
        await transfers.download_dir(source_dir, Path(target_dir))

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        if (transfers := self._archives()) is None:
            with self._prepare([]):  # a size probe: it changes nothing
                return await self._harbor_path().download_file(source_path, Path(target_path))
        await transfers.download_file(source_path, Path(target_path))

    def _harbor_path(self) -> HarborPath:
        """Harbor's transfer commands with our bounded host side (no archive capability)."""
        return HarborPath(self._run_shell, self._read_remote_bytes, self.logger)

    @override
    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        if (transfers := self._archives()) is None:
            return await super().is_dir(path, user=user)
        return await transfers.kind(path) == "dir"

    @override
    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        if (transfers := self._archives()) is None:
            return await super().is_file(path, user=user)
        return await transfers.kind(path) == "file"
