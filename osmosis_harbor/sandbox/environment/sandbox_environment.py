"""Harbor's SkyPilot environment over the ``sky.sandbox`` SDK chosen per environment (``sdk=``).

A subclass of Harbor's ``SkypilotEnvironment`` (trials take production's code path) holding one
sandbox's state (``state.py``) and only the methods Harbor calls, each handing its work to the
collaborator of that concern (``assembly.py`` makes them). Every Harbor name it touches is
listed, with why, in ``harbor_compat/surface.py``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast, override

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.definition import (
    has_agent_environment_definition,
    parse_dockerfile_workdir,
    require_agent_environment_definition,
)
from harbor.environments.skypilot import SkypilotEnvironment, _sanitize_dns_name
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import TaskOS
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor import settings
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox.environment.assembly import assemble
from osmosis_harbor.sandbox.environment.grouping import group_key_of, group_pool_of, pool_shape_of
from osmosis_harbor.sandbox.environment.images import declares_baked_layout
from osmosis_harbor.sandbox.environment.loss_detection import missing_as_file_not_found
from osmosis_harbor.sandbox.environment.preparation import REMOVE_REWARDS_COMMAND
from osmosis_harbor.sandbox.environment.state import EnvironmentState, StateView
from osmosis_harbor.sandbox.options import DEFAULT_PLATFORM, IMPORT_PATH, SandboxOptions
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_if_any
from osmosis_harbor.sandbox.owner.pools import environment_group_key, pool_name_for
from osmosis_harbor.sandbox.sdk.bounds import cpus_or_default, memory_mb_or_default
from osmosis_harbor.sandbox.sdk.faults import retry_safe
from osmosis_harbor.sandbox.sdk.registry import DEFAULT_SDK
from osmosis_harbor.sandbox.transfer.filtered import download_filtered, download_with_exclusions

__all__ = [
    "IMPORT_PATH",
    "REMOVE_REWARDS_COMMAND",
    "SandboxEnvironment",
    "declares_baked_layout",
    "environment_group_key",
    "pool_name_for",
]


def _done() -> ExecResult:
    """The answer to a command that needed no round trip."""
    return ExecResult(stdout="", stderr="", return_code=0)


class SandboxEnvironment(SkypilotEnvironment):
    """Harbor's SkyPilot sandbox environment over a selectable ``sky.sandbox`` SDK."""

    # Harbor 0.26 validates ``--ek`` through it; ours carries Harbor's keywords too, hence the ignores.
    options_model = SandboxOptions  # type: ignore[assignment, unused-ignore]

    @classmethod
    def parse_options(cls, kwargs: dict[str, Any] | None = None) -> SandboxOptions:  # type: ignore[override, unused-ignore]
        """The kwargs as our options (`ConfigError`, a ValueError, naming what is wrong): they
        carry Harbor's own keywords beside ours, which Harbor's model check would refuse."""
        return SandboxOptions.build(**(kwargs or {}))

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        """Before Harbor queues trials: valid kwargs, and what the chosen SDK needs here (not
        Harbor's, which requires ``sky.sandbox`` whatever the SDK). Harbor 0.25 passes no kwargs:
        nothing is checked then (a missing SDK still fails the trial, by name)."""
        error_policies.install()  # before Harbor's job runs a trial: our errors' policies
        if HARBOR.options_model:
            cast(Any, super(SkypilotEnvironment, cls)).preflight(kwargs)  # Harbor's base: parse_options
        if kwargs is not None:
            cls.parse_options(kwargs).impl.preflight()

    @override
    def _validate_definition(self) -> None:
        """Harbor's rule for the pool claimed: a generic pool supplies the image (no definition
        needed), a group pool's is the task's own (Harbor 0.26 reads the options' base name)."""
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
        warm_interpreters: bool | None = None,
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
        # Ours are named above and checked here; Harbor's own keywords go on to BaseEnvironment.
        options = SandboxOptions.build(
            sdk=sdk,
            host_network=host_network,
            pool_size=pool_size,
            warm_interpreters=warm_interpreters,
            registry=registry,
            pool=pool or None,
            context_name=context_name,
            namespace=namespace,
            secrets=secrets,
            platform=platform,
            auto_mounting=auto_mounting,
        )
        self._options = options
        # A task with no environment definition claims a named generic pool (SkyPilot's
        # ``default``) by its name, as in Harbor; any other, its group's (derived below).
        generic_pool = bool(options.pool) and not has_agent_environment_definition(
            environment_dir, docker_image=task_env_config.docker_image
        )
        self._state = EnvironmentState(
            sdk=options.impl.load(),
            name=_sanitize_dns_name(f"hb-{session_id}"),
            pool=options.pool if generic_pool else None,
            generic_pool=generic_pool,
        )
        # What SkypilotEnvironment.__init__ sets (surface "set"): its own refuses to run without an
        # import-time sky.sandbox, so BaseEnvironment.__init__ is called directly below.
        self._registry = options.registry or settings.current().registry or options.impl.default_registry
        self._context_name = options.context_name
        self._namespace = options.namespace
        self._secrets = list(options.secrets) if options.secrets else None
        self._platform = options.platform
        # Whoever submitted this trial owns its sandboxes; made by Harbor's CLI, it owns itself.
        submitter = owner_if_any()
        self._owner = submitter or SandboxOwner.make(f"environment {session_id}")
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
        self._compose(owns_itself=submitter is None)
        if options.pool and not generic_pool:  # None: the pool cannot serve this task, created cold
            self._state.pool = group_pool_of(self)

    def _compose(self, *, owns_itself: bool) -> None:
        """The collaborators (``assembly.py``): an exec goes through folds, records, the guard."""
        parts = assemble(self, owns_itself=owns_itself)
        self._losses, self._preparation, self._routes = parts.losses, parts.preparation, parts.routes
        self._images, self._creator, self._guard = parts.images, parts.creator, parts.guard
        self._exec_records = parts.exec_records

    # Harbor's attributes, views of the one state (its own start, stop and checks use them).
    _sandbox = StateView[Any]("sandbox")
    _sandbox_name = StateView[str]("name")
    _pool = StateView["str | None"]("pool")

    # ── what the rest of the package asks of an environment ─────────────────────

    @property
    def state(self) -> EnvironmentState:
        """The state of this environment's sandbox, which its collaborators share."""
        return self._state

    @property
    def group_key(self) -> str:
        """The environment group this sandbox belongs to (``grouping.py``)."""
        return group_key_of(self)

    def pool_shape(self) -> dict[str, Any]:
        """What a warm pool of this environment's group is created with, besides its image."""
        return pool_shape_of(self)

    @property
    def uses_host_network(self) -> bool:
        """Host networking lets a local sandbox reach a server on this machine; a task that
        declares no network gets none, host networking included."""
        return self._options.impl.reaches_host and self._options.host_network and not self._network_disabled

    @property
    def loss_role(self) -> str:
        """Whose sandbox this is (``loss_detection.loss_role_of``)."""
        return self._losses.role

    @property
    def pool_name(self) -> str | None:
        """The warm pool this environment claims from, if it was given a pool base name."""
        return self._state.pool

    @property
    def options(self) -> SandboxOptions:  # type: ignore[override, unused-ignore]
        """The sandbox options this environment was made with."""
        return self._options

    @property
    def sdk_name(self) -> str:
        return self._options.sdk

    @property
    def sandbox_name(self) -> str:
        return self._state.name

    @property
    def image_ref(self) -> str:
        """The content-addressed image this environment builds (for prewarm reports)."""
        return self._images.ref

    async def prepare_image(self, force_build: bool = False) -> tuple[str | None, bool]:
        """Make this environment's image available; returns (reference, built-by-this-call)."""
        return await self._images.prepare(force_build)

    # ── images and bounds ─────────────────────────────────────────────────────────

    @property
    @override
    def _image_ref(self) -> str:
        return self._images.ref

    @override
    async def _image_exists(self) -> bool:
        return await self._images.exists()

    @override
    async def _build_and_push_image(self) -> None:  # type: ignore[override]  # Harbor's is tenacity-wrapped
        await self._images.build()

    @override
    async def _resolve_image(self, force_build: bool) -> str | None:
        """Harbor's, except that concurrent trials of one environment build it once
        (its owner's ``ImageBuildCoordinator``); Harbor has no lock against parallel builds."""
        if self._pool:
            return None  # the pool supplies the image
        return (await self.prepare_image(force_build))[0]

    @property
    @override
    def _effective_cpus(self) -> int | float | None:
        """Harbor 0.25 passes no CPU or memory when a task names none: the sizing it documents."""
        return cpus_or_default(super()._effective_cpus)

    @property
    @override
    def _effective_memory_mb(self) -> int | None:
        return memory_mb_or_default(super()._effective_memory_mb)

    # ── the sandbox's lifecycle ─────────────────────────────────────────────────────

    @override
    async def _create_sandbox(self, image: str | None) -> Any:
        return await self._creator.create(image)

    @override
    async def _upload_environment_dir_after_start(self) -> None:
        """Harbor's upload into a generic pool's sandbox only: a group pool's image is this
        task's own (its key holds the content hash), so the upload would repeat what it holds."""
        if self._state.generic_pool:
            await super()._upload_environment_dir_after_start()
        else:
            await BaseEnvironment._upload_environment_dir_after_start(self)

    @override
    async def stop(self, delete: bool) -> None:
        """Harbor's stop, after dropping uploads staged for a sandbox that is going away and
        marking the stop as ours (a failure from here on is not a lost sandbox)."""
        self._state.stopping = True
        self._routes.discard()
        await super().stop(delete)
        await self._creator.after_stop()

    @override
    async def _terminate_sandbox(self) -> None:  # type: ignore[override]  # Harbor's is tenacity-wrapped
        self._require_sandbox()
        await self._creator.terminate()

    # ── commands ──────────────────────────────────────────────────────────────────
    # Every command and transfer goes through the loss guard (a failure asks if the sandbox lives).

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if await self._guard.took(command, self._resolve_user(user)):
            return _done()
        if self._preparation.skips(command, self._resolve_user(user)):
            return _done()
        async with self._routes.command(command) as fold:  # transfers may ride it (exec_folds.py)
            result = await self._losses.guarded(
                super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
            )
        return await self._routes.settle(fold, result)

    def logs_follow(self, command: str) -> None:
        """Harbor reads ``/logs`` right after the next exec of ``command``: the read may ride it."""
        self._routes.logs_follow(command)

    @override
    async def _run_shell(self, command: str, *, timeout_seconds: int) -> ExecResult:
        async with self._routes.command():
            return await self._losses.guarded(super()._run_shell(command, timeout_seconds=timeout_seconds))

    @override
    async def _dispatch_exec(
        self, argv: list[str], *, workdir: str | None, timeout_seconds: int, env: dict[str, str] | None = None
    ) -> Any:
        """With the transfers riding it, under an exec record (``exec_records.py``), behind the guard."""
        argv, timeout_seconds = self._routes.riding_argv(argv, timeout_seconds)
        return await self._exec_records.dispatch(argv, workdir=workdir, timeout_seconds=timeout_seconds, env=env)

    @override
    async def ensure_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        return await self._preparation.ensure(dirs, functools.partial(super().ensure_dirs, dirs, chmod=chmod))

    @override
    async def empty_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        return await self._preparation.empty(dirs, chmod, functools.partial(super().empty_dirs, dirs, chmod=chmod))

    # ── files: the archive route when there is one, else Harbor's (``routes.py``) ──────────

    @override
    async def _write_remote_bytes(self, data: bytes, remote_path: str) -> None:
        await self._losses.guarded(retry_safe("write_bytes", super()._write_remote_bytes, data, remote_path))

    @override
    async def _read_remote_bytes(self, remote_path: str) -> bytes:
        """A missing file is ``FileNotFoundError`` whatever the SDK's shape of "not found"."""
        with missing_as_file_not_found(remote_path):
            return await self._losses.guarded(retry_safe("read_bytes", super()._read_remote_bytes, remote_path))

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._routes.upload_dir(Path(source_dir), target_dir, harbor=super().upload_dir)

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._routes.upload_file(Path(source_path), target_path, harbor=super().upload_file)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._routes.download_dir(source_dir, Path(target_dir))

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._routes.download_file(source_path, Path(target_path))

    @override
    async def _download_dir_with_exclusions_impl(
        self, *, source_dir: str, target_dir: Path | str, exclude: list[str], service: str | None
    ) -> None:
        await download_with_exclusions(
            self, source_dir=source_dir, target_dir=target_dir, exclude=exclude, service=service
        )

    @override
    async def download_dir_filtered(
        self,
        *,
        source_dir: str,
        target_dir: Path | str,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        protect: Sequence[str] | None = None,
    ) -> None:
        filtered = (
            super().download_dir_filtered if self.os == TaskOS.WINDOWS else functools.partial(download_filtered, self)
        )
        await filtered(source_dir=source_dir, target_dir=target_dir, include=include, exclude=exclude, protect=protect)

    @override
    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        return await self._routes.is_kind(path, "dir", harbor=functools.partial(super().is_dir, user=user))

    @override
    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        return await self._routes.is_kind(path, "file", harbor=functools.partial(super().is_file, user=user))
