"""Our Harbor environment: a ``BaseEnvironment`` of Harbor's over the ``sky.sandbox`` SDK chosen
per environment (``sdk=``), a thin adapter over collaborators built from values (``assembly.py``).

It is not Harbor's ``SkypilotEnvironment``: it keeps that class's behaviour where we match it
(its create keywords, its exec argv, env and workdir, the 3600 s cap, its DNS names: pinned by
``tests/unit/sandbox/test_skypilot_call_shapes.py`` against Harbor's own class) and does the rest its own way.
Harbor calls its methods; each hands its work to the collaborator of that concern, and every
command goes down one pipeline to the SDK (``commands.py``). The Harbor names it relies on are
``BaseEnvironment``'s, listed with why in ``harbor_compat/surface_environment.py``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, override

from harbor.environments.base import ExecResult
from harbor.environments.definition import (
    effective_exec_cwd,
    has_agent_environment_definition,
    parse_dockerfile_workdir,
    require_agent_environment_definition,
)
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import TaskOS
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor import settings
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.skypilot_names import MAX_EXEC_TIMEOUT_SEC, sanitize_dns_name
from osmosis_harbor.sandbox.environment.assembly import EnvironmentFacts, assemble
from osmosis_harbor.sandbox.environment.class_facts import SandboxEnvironmentBase
from osmosis_harbor.sandbox.environment.commands import Command, exec_argv
from osmosis_harbor.sandbox.environment.grouping import declares_no_network, group_pool, pool_shape
from osmosis_harbor.sandbox.environment.images import ImageSource, declares_baked_layout
from osmosis_harbor.sandbox.environment.own_sandbox import CreateSpec, SandboxPlan, WorkdirReset
from osmosis_harbor.sandbox.environment.preparation import REMOVE_REWARDS_COMMAND
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.options import DEFAULT_PLATFORM, IMPORT_PATH, SandboxOptions
from osmosis_harbor.sandbox.owner.context import SandboxOwner, TrialContext
from osmosis_harbor.sandbox.owner.pools import environment_group_key, pool_name_for
from osmosis_harbor.sandbox.sdk.bounds import cpus_or_default, memory_mb_or_default
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


class SandboxEnvironment(SandboxEnvironmentBase):
    """Harbor's environment for our sandboxes, over a selectable ``sky.sandbox`` SDK."""

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
        # Ours are named above and checked here; Harbor's own keywords go on to BaseEnvironment.
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
        self._options = options  # Harbor 0.26's __init__ reads ``self.options`` (below) as set
        current = settings.current()  # read once: the collaborators carry it
        # A task with no environment definition claims a named generic pool (SkyPilot's
        # ``default``) by its name, as in Harbor; any other, its group's (derived below).
        generic_pool = bool(options.pool) and not has_agent_environment_definition(
            environment_dir, docker_image=task_env_config.docker_image
        )
        self._state = EnvironmentState(
            sdk=options.impl.load(),
            name=sanitize_dns_name(f"hb-{session_id}"),
            pool=options.pool if generic_pool else None,
            generic_pool=generic_pool,
        )
        self._image_registry = options.registry or current.registry or options.impl.default_registry
        self._context = TrialContext.of(session_id, f"environment {session_id}", current)
        super().__init__(
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            auto_mounting=options.auto_mounting,
            **kwargs,
        )
        self._dockerfile_workdir = parse_dockerfile_workdir(self.dockerfile)
        parts = assemble(self._state, self._context, self._facts(current))
        self._session, self._routes, self._preparation = parts.session, parts.routes, parts.preparation
        self._images, self._creator, self._records = parts.images, parts.creator, parts.records
        self._pipeline = parts.pipeline
        if options.pool and not generic_pool:  # None: the pool cannot serve this task, created cold
            self._state.pool = group_pool(
                options, self.group_key, no_network=self._network_disabled, logger=self.logger
            )

    def _facts(self, current: settings.Settings) -> EnvironmentFacts:
        """What the collaborators are made from (``assembly.py``), read once."""
        options, docker_image, dockerfile = self._options, self.task_env_config.docker_image, self.dockerfile
        workdirs = {
            d.rstrip("/") for d in (self.task_env_config.workdir, self._dockerfile_workdir) if d and d.rstrip("/")
        }
        image = ImageSource(
            environment_dir=self.environment_dir,
            dockerfile=dockerfile,
            docker_image=docker_image,
            registry=self._image_registry,
            platform=options.platform,
            local_only=options.impl.local_images and not self._image_registry,
        )
        plan = SandboxPlan(
            session_id=self.session_id,
            sdk_name=options.sdk,
            pool_base=options.pool,
            baked_layout=declares_baked_layout(dockerfile) and not (docker_image and not dockerfile.is_file()),
            environment_upload=self._enable_environment_dir_upload,
        )
        records = options.impl.records_exec_results
        return EnvironmentFacts(
            image, self.environment_id, plan, tuple(sorted(workdirs)), records, current, self.logger
        )

    @override
    def _validate_definition(self) -> None:
        """Harbor's rule for the pool claimed: a generic pool supplies the image (no definition
        needed), a group pool's is the task's own."""
        if self._options.pool and self._state.generic_pool:
            if not self._enable_environment_dir_upload:
                raise ValueError(
                    "SkyPilot warm pools do not support dedicated verifier images or build definitions "
                    "because the pool supplies its own image. Remove the 'pool' environment kwarg to use "
                    "the verifier image or build definition."
                )
            return
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    # ── what the rest of the package asks of an environment ─────────────────────

    @property
    def dockerfile(self) -> Path:
        """What is built, and where the baked-bundle marker is read."""
        return self.environment_dir / "Dockerfile"

    @property
    def state(self) -> EnvironmentState:
        """The state of this environment's sandbox, which its collaborators share."""
        return self._state

    @property
    def sandbox(self) -> Any | None:
        """The live handle (None before a start and after a stop)."""
        return self._state.sandbox

    @sandbox.setter
    def sandbox(self, handle: Any | None) -> None:
        """A handle set from outside (a test, a tool): stop terminates it through the owner."""
        self._state.sandbox = handle

    @property
    def owner(self) -> SandboxOwner:
        """Whoever owns this environment's sandboxes (its trial context's)."""
        return self._context.owner

    @property
    def group_key(self) -> str:
        """The environment group this sandbox belongs to (``grouping.py``)."""
        no_network = declares_no_network(self.task_env_config)
        return environment_group_key(self.environment_id, self._effective_cpus, self._effective_memory_mb, no_network)

    def pool_shape(self) -> dict[str, Any]:
        """What a warm pool of this environment's group is created with, besides its image."""
        return pool_shape(
            self._options, self._effective_cpus, self._effective_memory_mb, no_network=self._network_disabled
        )

    @property
    def pool_name(self) -> str | None:
        """The warm pool this environment claims from, if it was given a pool base name."""
        return self._state.pool

    @property
    def options(self) -> SandboxOptions:  # type: ignore[override, unused-ignore]
        """The sandbox options this environment was made with."""
        return self._options

    sdk_name = property(lambda self: self._options.sdk, doc="The chosen SDK's name.")
    sandbox_name = property(lambda self: self._state.name, doc="The sandbox's name (a batch member's once claimed).")

    @property
    def image_ref(self) -> str:
        """The content-addressed image this environment builds (for prewarm reports)."""
        return self._images.ref

    async def prepare_image(self, force_build: bool = False) -> tuple[str | None, bool]:
        """Make this environment's image available; returns (reference, built-by-this-call).
        Concurrent trials of one environment build it once (its owner's coordinator)."""
        return await self._images.prepare(force_build)

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
    async def start(self, force_build: bool) -> None:
        """Harbor's start: the image (none from a pool, which supplies its own), the sandbox
        created or claimed (``own_sandbox.py``), Harbor's mount targets made, ``environment/``
        uploaded where Harbor uploads it."""
        image = None if self._state.pool else (await self.prepare_image(force_build))[0]
        sandbox, ready = await self._creator.create(image, self._create_spec(), self._workdir_reset())
        if sandbox is None:
            raise RuntimeError("SkyPilot sandbox was not created.")
        self._state.sandbox = sandbox
        self._routes.started(ready)
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    def _create_spec(self) -> CreateSpec:
        """Harbor's create keywords as they stand at the start (frozen for this sandbox)."""
        return CreateSpec(
            context_name=self._options.context_name,
            namespace=self._options.namespace,
            env=tuple(sorted((self._persistent_env or {}).items())),
            secrets=tuple(self._options.secrets) if self._options.secrets else None,
            cpus=self._effective_cpus,
            memory_mb=self._effective_memory_mb,
            registry=self._image_registry,
            block_network=self._network_disabled,
            # Host networking lets a local sandbox reach a server on this machine; a task that
            # declares no network gets none, host networking included.
            host_network=self._options.impl.reaches_host and self._options.host_network and not self._network_disabled,
        )

    def _workdir_reset(self) -> WorkdirReset | None:
        """How Harbor would empty the agent's workdir, for a head-started verifier sandbox."""
        workdir = self.task_env_config.workdir or self._dockerfile_workdir
        if not workdir or PurePosixPath(workdir) == PurePosixPath("/"):
            return None
        dirs = [str(PurePosixPath(workdir))]
        argv = exec_argv(self._empty_dirs_command(dirs, chmod=True), self._reset_dirs_user())
        return WorkdirReset(dirs[0], tuple(argv), tuple(sorted((self._merge_env(None) or {}).items())))

    @override
    async def _upload_environment_dir_after_start(self) -> None:
        """A generic pool's image never holds the task's files: ``environment/`` goes to the
        workdir whenever it has content (Harbor's SkyPilot rule). A group pool's image is this
        task's own, and a plain create's uploads only what Harbor's base uploads."""
        if not self._state.generic_pool:
            return await super()._upload_environment_dir_after_start()
        source = self.environment_dir
        if not self._enable_environment_dir_upload or not source.is_dir() or not any(source.iterdir()):
            return
        workdir = self.task_env_config.workdir or ((await self.exec("pwd")).stdout or "/").strip()
        self.logger.debug(f"Uploading environment/ to {workdir}")
        await self.upload_dir(self.environment_dir, workdir)

    @override
    async def stop(self, delete: bool) -> None:
        """Uploads still staged are dropped (the sandbox is going away), the stop is marked as
        ours (a failure from here on is not a lost sandbox), and the sandbox is terminated
        through the owner (SkyPilot sandboxes are ephemeral: whatever ``delete`` says)."""
        self._state.stopping = True
        self._routes.discard()
        if self._state.sandbox is None:
            self.logger.debug("Sandbox has already been removed.")
        else:
            try:
                await self._creator.terminate()
            except Exception as exc:
                self.logger.error(f"Error terminating SkyPilot sandbox: {exc}")
            finally:
                self._state.sandbox = None
        await self._creator.after_stop()

    # ── commands: one pipeline down to the SDK (``commands.py``) ─────────────────────

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        timeout = MAX_EXEC_TIMEOUT_SEC if timeout_sec is None else min(timeout_sec, MAX_EXEC_TIMEOUT_SEC)
        workdir = effective_exec_cwd(cwd, self.task_env_config.workdir, self._dockerfile_workdir)
        merged = self._merge_env(env) or None
        return await self._pipeline.run(Command(command, user, exec_argv(command, user), merged, workdir, timeout))

    def logs_follow(self, command: str) -> None:
        """Harbor reads ``/logs`` right after the next exec of ``command``: the read may ride it."""
        self._routes.logs_follow(command)

    async def run_shell(self, command: str, *, timeout_seconds: int) -> ExecResult:
        """A raw ``sh -c`` command (no workdir, env or user), after the uploads before it."""
        return await self._pipeline.shell(command, timeout_seconds)

    @override
    async def ensure_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        return await self._preparation.ensure(dirs, functools.partial(super().ensure_dirs, dirs, chmod=chmod))

    @override
    async def empty_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        # Harbor's emptying command for Windows is not a POSIX shell's: never staged there.
        command = None if self.os == TaskOS.WINDOWS else self._empty_dirs_command(dirs, chmod=chmod)
        harbor = functools.partial(super().empty_dirs, dirs, chmod=chmod)
        return await self._preparation.empty(dirs, chmod, harbor, command)

    # ── files: the transfer router's (``routes.py``) ────────────────────────────────

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._routes.upload_dir(Path(source_dir), target_dir)

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._routes.upload_file(Path(source_path), target_path)

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
            self, self._routes.limits, source_dir=source_dir, target_dir=target_dir, exclude=exclude, service=service
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
            super().download_dir_filtered
            if self.os == TaskOS.WINDOWS
            else functools.partial(download_filtered, self, self._routes.limits)
        )
        await filtered(source_dir=source_dir, target_dir=target_dir, include=include, exclude=exclude, protect=protect)

    @override
    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        return await self._routes.is_kind(path, "dir", harbor=functools.partial(super().is_dir, user=user))

    @override
    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        return await self._routes.is_kind(path, "file", harbor=functools.partial(super().is_file, user=user))
