"""Harbor's SkyPilot environment over the ``sky.sandbox`` SDK chosen per environment (``sdk=``).

``SandboxEnvironment`` subclasses Harbor's ``SkypilotEnvironment``, so that trials take the
code path they take in production. It holds one sandbox's state (``state.py``) and keeps only
the methods Harbor calls, each handing its work to the collaborator of that concern: creating
and claiming (``own_sandbox.py``), images (``images.py``), lost sandboxes
(``loss_detection.py``), elided preparation (``preparation.py``), exec records
(``exec_records.py``), the verifier guard (``verifier_guard.py``), transfer routes
(``routes.py``, ``transfer/filtered.py``) and default bounds (``sdk/bounds.py``). Every Harbor
name this touches is listed, with why, in ``harbor_compat/surface.py``.
"""

from __future__ import annotations

import errno
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
from harbor.environments.skypilot import _REMOTE_TRANSFER_DIR, SkypilotEnvironment, _sanitize_dns_name
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode, TaskOS
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor import settings
from osmosis_harbor.errors import SandboxLostError
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat.version import HARBOR
from osmosis_harbor.sandbox.environment.exec_records import ExecRecorder
from osmosis_harbor.sandbox.environment.images import (
    HARBOR_BUILD_ONCE,
    HarborImages,
    ImageResolver,
    ImageSource,
    declares_baked_layout,
)
from osmosis_harbor.sandbox.environment.loss_detection import LossGuard, loss_role_of
from osmosis_harbor.sandbox.environment.own_sandbox import CreateSpec, SandboxCreator, SandboxPlan, WorkdirReset
from osmosis_harbor.sandbox.environment.preparation import REMOVE_REWARDS_COMMAND, PreparationElider
from osmosis_harbor.sandbox.environment.routes import FileCalls, TransferRoutes
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.environment.verifier_guard import VerifierGuardExecs
from osmosis_harbor.sandbox.guard.session import current_guard
from osmosis_harbor.sandbox.options import DEFAULT_PLATFORM, IMPORT_PATH, SandboxOptions
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_if_any
from osmosis_harbor.sandbox.owner.pools import environment_group_key, pool_name_for
from osmosis_harbor.sandbox.sdk.bounds import cpus_or_default, memory_mb_or_default
from osmosis_harbor.sandbox.sdk.errors import is_missing
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
        # A task with no environment definition (no Dockerfile, no docker_image) runs, as in
        # Harbor, from a named pool whose image is generic (SkyPilot's built-in ``default``):
        # claimed by its own name, set before Harbor's _validate_definition reads it. Any other
        # task's pool is its environment group's, derived below once the environment is known.
        generic_pool = bool(options.pool) and not has_agent_environment_definition(
            environment_dir, docker_image=task_env_config.docker_image
        )
        self._state = EnvironmentState(
            sdk=options.impl.load(),
            name=_sanitize_dns_name(f"hb-{session_id}"),
            pool=options.pool if generic_pool else None,
            generic_pool=generic_pool,
        )
        # The other attributes SkypilotEnvironment.__init__ sets (``harbor_compat/surface.py``, use
        # "set"). Its own __init__ refuses to run unless Harbor imported sky.sandbox at import time;
        # the SDK is ours to choose, so we set them here and go straight to BaseEnvironment.__init__.
        self._registry = options.registry or settings.current().registry or options.impl.default_registry
        self._context_name = options.context_name
        self._namespace = options.namespace
        self._secrets = list(options.secrets) if options.secrets else None
        self._platform = options.platform
        # Whoever submitted this trial owns its sandboxes (a backend, a validation run); made by
        # Harbor's own CLI outside every owner, the environment owns itself (closed at stop).
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
        if options.pool and not generic_pool:
            self._state.pool = pool_name_for(options.pool, self.group_key)

    def _compose(self, *, owns_itself: bool) -> None:
        """The collaborators, each given the state and the narrow calls it needs; an exec goes
        through the exec records, then the verifier guard, then Harbor's dispatch."""
        state = self._state
        self._losses = LossGuard(state, loss_role_of(self.session_id))
        self._preparation = PreparationElider(state)
        files = FileCalls(
            run_shell=self._run_shell,
            harbor_shell=functools.partial(SkypilotEnvironment._run_shell, self),
            write_bytes=self._write_remote_bytes,
            read_bytes=self._read_remote_bytes,
        )
        self._routes = TransferRoutes(state, self._preparation, self._losses.guarded, files, self.logger)
        self._images = self._image_resolver()
        self._creator = self._sandbox_creator(owns_itself)
        self._guard = self._verifier_guard()
        self._exec_records = ExecRecorder(
            state, self._guard.dispatch, self._require_sandbox, enabled=self._options.impl.records_exec_results
        )

    def _image_resolver(self) -> ImageResolver:
        source = ImageSource(
            environment_dir=self.environment_dir,
            dockerfile=self._dockerfile_path,
            docker_image=self.task_env_config.docker_image,
            registry=self._registry,
            platform=self._platform,
            local_only=self._options.impl.local_images and not self._registry,
        )
        harbor = HarborImages(
            ref=lambda: super(SandboxEnvironment, self)._image_ref,
            exists=functools.partial(SkypilotEnvironment._image_exists, self),
            build_once=functools.partial(HARBOR_BUILD_ONCE, self),
        )
        return ImageResolver(source, lambda: self.environment_id, self._owner.builds, harbor, self.logger)

    def _sandbox_creator(self, owns_itself: bool) -> SandboxCreator:
        plan = SandboxPlan(
            session_id=self.session_id,
            sdk_name=self._options.sdk,
            pool_base=self._options.pool,
            baked_layout=declares_baked_layout(self._dockerfile_path)
            and not (self.task_env_config.docker_image and not self._dockerfile_path.is_file()),
            environment_upload=self._enable_environment_dir_upload,
            owns_itself=owns_itself,
        )
        reset = WorkdirReset(
            workdir=self.task_env_config.workdir or self._workdir,
            argv=lambda dirs: self._exec_argv(self._empty_dirs_command(dirs, chmod=True), self._reset_dirs_user()),
            env=lambda: self._merge_env(None) or None,
        )
        return SandboxCreator(
            self._state, self._owner, plan, self._create_spec, reset, self._images.prepare, self.logger
        )

    def _verifier_guard(self) -> VerifierGuardExecs:
        """The verifier guard of the trial, for its agent's sandbox (a separate verifier's needs none)."""
        workdirs = {d.rstrip("/") for d in (self.task_env_config.workdir, self._workdir) if d and d.rstrip("/")}
        return VerifierGuardExecs(
            current_guard() if self._losses.role == "agent" else None,
            self._dockerfile_path,
            self._state,
            platform=self._platform,
            workdirs=sorted(workdirs),
            launch=functools.partial(SkypilotEnvironment._dispatch_exec, self),
            guarded=self._losses.guarded,
            write_bytes=self._write_remote_bytes,
        )

    def _create_spec(self) -> CreateSpec:
        """Harbor's create keywords as they stand now (the trial's env may have grown)."""
        return CreateSpec(
            context_name=self._context_name,
            namespace=self._namespace,
            env=tuple(sorted((self._persistent_env or {}).items())),
            secrets=tuple(self._secrets) if self._secrets else None,
            cpus=self._effective_cpus,
            memory_mb=self._effective_memory_mb,
            registry=self._registry,
            block_network=self._network_disabled,
            host_network=self.uses_host_network,
        )

    # ── Harbor's attributes, views of the one state ──────────────────────────────

    @property
    def _sandbox(self) -> Any | None:
        return self._state.sandbox

    @_sandbox.setter
    def _sandbox(self, sandbox: Any | None) -> None:
        self._state.sandbox = sandbox

    @property
    def _sandbox_name(self) -> str:
        return self._state.name

    @_sandbox_name.setter
    def _sandbox_name(self, name: str) -> None:
        self._state.name = name

    @property
    def _pool(self) -> str | None:
        return self._state.pool

    @_pool.setter
    def _pool(self, pool: str | None) -> None:
        self._state.pool = pool

    # ── what the rest of the package asks of an environment ─────────────────────

    @property
    def state(self) -> EnvironmentState:
        """The state of this environment's sandbox, which its collaborators share."""
        return self._state

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
    def options(self) -> SandboxOptions:
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
        """Upload ``environment/`` only where a plain start would, or into a generic pool.

        Harbor ships ``environment/`` into every pool launch because SkyPilot pool images are
        generic. Ours are not: a group pool is per environment group, and the group key
        includes this environment's content hash, so the pool's image is the very image a
        plain start of this task uses; the upload (a ``pwd`` probe and a directory transfer
        per trial) would only repeat what the image holds. A generic pool (a task with no
        environment definition) gets Harbor's own upload."""
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
    # Every command and transfer goes through the loss guard: a failure asks the SDK whether
    # the sandbox is still there.

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
        async with self._routes.command():
            return await self._losses.guarded(
                super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
            )

    @override
    async def _run_shell(self, command: str, *, timeout_seconds: int) -> ExecResult:
        async with self._routes.command():
            return await self._losses.guarded(super()._run_shell(command, timeout_seconds=timeout_seconds))

    @override
    async def _dispatch_exec(
        self, argv: list[str], *, workdir: str | None, timeout_seconds: int, env: dict[str, str] | None = None
    ) -> Any:
        """Under an exec record (``exec_records.py``), then behind the verifier guard."""
        return await self._exec_records.dispatch(argv, workdir=workdir, timeout_seconds=timeout_seconds, env=env)

    @override
    async def ensure_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        if self._preparation.skippable(dirs):
            return _done()
        with self._preparation.scoped(dirs):
            return await super().ensure_dirs(dirs, chmod=chmod)

    @override
    async def empty_dirs(self, dirs: Sequence[Any], *, chmod: bool = True) -> ExecResult | None:
        if self._preparation.skippable(dirs):
            return _done()
        with self._preparation.scoped(dirs):
            result = await super().empty_dirs(dirs, chmod=chmod)
        if result is not None and result.return_code == 0 and chmod:
            self._preparation.emptied(dirs)
        return result

    # ── files ─────────────────────────────────────────────────────────────────────
    # Overridden to take the archive route when there is one (``routes.py``). On Harbor's
    # route a transfer is commands in the sandbox; each touches only the transfer's target and
    # its temp archive under Harbor's transfer dir, so it makes only those unknown
    # (``preparation.py``), not every dir known ready: a later preparation there stays elided.

    @override
    async def _write_remote_bytes(self, data: bytes, remote_path: str) -> None:
        await self._losses.guarded(retry_safe("write_bytes", super()._write_remote_bytes, data, remote_path))

    @override
    async def _read_remote_bytes(self, remote_path: str) -> bytes:
        """A file's bytes; a missing file is ``FileNotFoundError`` whatever the SDK's shape of
        "not found" (SkyPilot's is a status, not a builtin), once the sandbox is known alive."""
        try:
            return await self._losses.guarded(retry_safe("read_bytes", super()._read_remote_bytes, remote_path))
        except SandboxLostError:
            raise
        except Exception as exc:
            if is_missing(exc) and not isinstance(exc, FileNotFoundError):
                raise FileNotFoundError(errno.ENOENT, f"no such file in the sandbox ({exc})", remote_path) from exc
            raise

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        self._preparation.forget_ready([target_dir])
        if (transfers := self._routes.archives()) is None:
            with self._preparation.scoped([target_dir, _REMOTE_TRANSFER_DIR]):
                return await super().upload_dir(source_dir, target_dir)
        transfers.stage_dir(Path(source_dir), target_dir)

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self._preparation.forget_ready([target_path])
        if (transfers := self._routes.archives()) is None:
            return await super().upload_file(source_path, target_path)
        transfers.stage_file(Path(source_path), target_path)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        if (transfers := self._routes.archives()) is None:
            with self._preparation.scoped([_REMOTE_TRANSFER_DIR]):
                await self._routes.harbor_path().download_dir(source_dir, Path(target_dir))
            return
        await transfers.download_dir(source_dir, Path(target_dir))

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        if (transfers := self._routes.archives()) is None:
            with self._preparation.scoped([]):  # a size probe: it changes nothing
                return await self._routes.harbor_path().download_file(source_path, Path(target_path))
        await transfers.download_file(source_path, Path(target_path))

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
        if self.os == TaskOS.WINDOWS:  # Harbor's Windows branch goes through download_dir (ours)
            return await super().download_dir_filtered(
                source_dir=source_dir, target_dir=target_dir, include=include, exclude=exclude, protect=protect
            )
        await download_filtered(
            self, source_dir=source_dir, target_dir=target_dir, include=include, exclude=exclude, protect=protect
        )

    @override
    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        if (transfers := self._routes.archives()) is None:
            return await super().is_dir(path, user=user)
        return await transfers.kind(path) == "dir"

    @override
    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        if (transfers := self._routes.archives()) is None:
            return await super().is_file(path, user=user)
        return await transfers.kind(path) == "file"
