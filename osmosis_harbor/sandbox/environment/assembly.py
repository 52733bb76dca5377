"""One environment's collaborators, made from it: each given the environment's state and the
narrow calls it needs, so none of them sees the environment whole."""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harbor.environments.skypilot import SkypilotEnvironment
from harbor.models.task.config import TaskOS

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
from osmosis_harbor.sandbox.environment.preparation import PreparationElider
from osmosis_harbor.sandbox.environment.routes import FileCalls, TransferRoutes
from osmosis_harbor.sandbox.environment.verifier_guard import VerifierGuardExecs
from osmosis_harbor.sandbox.guard.session import current_guard

if TYPE_CHECKING:
    from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment

__all__ = ["Collaborators", "assemble"]


@dataclass(frozen=True)
class Collaborators:
    losses: LossGuard
    preparation: PreparationElider
    routes: TransferRoutes
    images: ImageResolver
    creator: SandboxCreator
    guard: VerifierGuardExecs
    exec_records: ExecRecorder


def assemble(env: SandboxEnvironment, *, owns_itself: bool) -> Collaborators:
    """The collaborators of ``env``, made once its Harbor attributes are set."""
    state = env.state
    losses = LossGuard(state, loss_role_of(env.session_id))
    preparation = PreparationElider(state)
    files = FileCalls(
        run_shell=env._run_shell,
        harbor_shell=functools.partial(SkypilotEnvironment._run_shell, env),
        write_bytes=env._write_remote_bytes,
        read_bytes=env._read_remote_bytes,
    )
    companions = artifact_roots(env.environment_dir.parent / "task.toml") if losses.role == "agent" else ()
    routes = TransferRoutes(
        state, preparation, losses.guarded, files, env.logger, companions, fresh_verifier=losses.role == "verifier"
    )
    if env.os != TaskOS.WINDOWS:  # Harbor's emptying command for Windows is not a POSIX shell's
        preparation.defers_with(
            lambda dirs, chmod: routes.stage_preparation(env._empty_dirs_command(dirs, chmod=chmod), dirs)
        )
    images = _image_resolver(env)
    creator = _sandbox_creator(env, images, owns_itself)
    guard = _verifier_guard(env, losses)
    exec_records = ExecRecorder(
        state, guard.dispatch, env._require_sandbox, enabled=env.options.impl.records_exec_results
    )
    return Collaborators(losses, preparation, routes, images, creator, guard, exec_records)


def artifact_roots(task_toml: Path) -> tuple[str, ...]:
    """The task's declared artifacts that Harbor downloads whole from the agent's sandbox after
    its run (absolute paths outside ``/logs``, no exclusions, the main container): fetched in
    the same archive as ``/logs`` on the SkyPilot path (``exec_archives.py``)."""
    try:
        text = task_toml.read_text(encoding="utf-8")
    except OSError:
        return ()
    return _artifact_roots(text)


@functools.lru_cache(maxsize=256)
def _artifact_roots(text: str) -> tuple[str, ...]:
    from harbor.models.task.config import TaskConfig

    try:
        artifacts = TaskConfig.model_validate_toml(text).artifacts
    except Exception:  # Harbor's own trial reports a broken task.toml
        return ()
    roots = []
    for artifact in artifacts:
        source, plain = (artifact, True) if isinstance(artifact, str) else (artifact.source, not artifact.exclude)
        if plain and getattr(artifact, "service", None) in (None, "main") and source.startswith("/"):
            path = posixpath.normpath(source)
            if path != "/" and not (path == "/logs" or path.startswith("/logs/")):
                roots.append(path)
    return tuple(dict.fromkeys(roots))


def _image_resolver(env: SandboxEnvironment) -> ImageResolver:
    source = ImageSource(
        environment_dir=env.environment_dir,
        dockerfile=env._dockerfile_path,
        docker_image=env.task_env_config.docker_image,
        registry=env._registry,
        platform=env._platform,
        local_only=env.options.impl.local_images and not env._registry,
    )
    harbor = HarborImages(
        ref=lambda: SkypilotEnvironment._image_ref.fget(env),  # type: ignore[attr-defined]
        exists=functools.partial(SkypilotEnvironment._image_exists, env),
        build_once=functools.partial(HARBOR_BUILD_ONCE, env),
    )
    return ImageResolver(source, lambda: env.environment_id, env._owner.builds, harbor, env.logger)


def _sandbox_creator(env: SandboxEnvironment, images: ImageResolver, owns_itself: bool) -> SandboxCreator:
    plan = SandboxPlan(
        session_id=env.session_id,
        sdk_name=env.options.sdk,
        pool_base=env.options.pool,
        baked_layout=declares_baked_layout(env._dockerfile_path)
        and not (env.task_env_config.docker_image and not env._dockerfile_path.is_file()),
        environment_upload=env._enable_environment_dir_upload,
        owns_itself=owns_itself,
    )
    reset = WorkdirReset(
        workdir=env.task_env_config.workdir or env._workdir,
        argv=lambda dirs: env._exec_argv(env._empty_dirs_command(dirs, chmod=True), env._reset_dirs_user()),
        env=lambda: env._merge_env(None) or None,
    )
    spec = functools.partial(_create_spec, env)
    return SandboxCreator(env.state, env._owner, plan, spec, reset, images.prepare, env.logger)


def _create_spec(env: SandboxEnvironment) -> CreateSpec:
    """Harbor's create keywords as they stand now (the trial's env may have grown)."""
    return CreateSpec(
        context_name=env._context_name,
        namespace=env._namespace,
        env=tuple(sorted((env._persistent_env or {}).items())),
        secrets=tuple(env._secrets) if env._secrets else None,
        cpus=env._effective_cpus,
        memory_mb=env._effective_memory_mb,
        registry=env._registry,
        block_network=env._network_disabled,
        host_network=env.uses_host_network,
    )


def _verifier_guard(env: SandboxEnvironment, losses: LossGuard) -> VerifierGuardExecs:
    """The verifier guard of the trial, for its agent's sandbox (a separate verifier's needs none)."""
    workdirs = {d.rstrip("/") for d in (env.task_env_config.workdir, env._workdir) if d and d.rstrip("/")}
    return VerifierGuardExecs(
        current_guard() if losses.role == "agent" else None,
        env._dockerfile_path,
        env.state,
        platform=env._platform,
        workdirs=sorted(workdirs),
        launch=functools.partial(SkypilotEnvironment._dispatch_exec, env),
        guarded=losses.guarded,
        write_bytes=env._write_remote_bytes,
    )
