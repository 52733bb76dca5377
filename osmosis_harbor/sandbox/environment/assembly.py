"""One environment's collaborators, made from values the environment read once at its init
(`EnvironmentFacts`) and its trial context: none of them sees the environment, and each is
handed the narrow calls of the ones below it (session <- guard <- exec records <- transfer
router <- preparation <- command pipeline)."""

from __future__ import annotations

import functools
import logging
import posixpath
from dataclasses import dataclass
from pathlib import Path

from osmosis_harbor.errors import DatasetError
from osmosis_harbor.sandbox.environment.commands import CommandPipeline, raw_shell
from osmosis_harbor.sandbox.environment.exec_records import ExecRecorder
from osmosis_harbor.sandbox.environment.images import ImageResolver, ImageSource
from osmosis_harbor.sandbox.environment.lost_sandbox import LossGuard
from osmosis_harbor.sandbox.environment.own_sandbox import SandboxCreator, SandboxPlan
from osmosis_harbor.sandbox.environment.preparation import PreparationElider
from osmosis_harbor.sandbox.environment.routes import FileCalls, TransferRoutes
from osmosis_harbor.sandbox.environment.session import SandboxSession
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.environment.verifier_guard import VerifierGuardExecs
from osmosis_harbor.sandbox.owner.context import Role, TrialContext
from osmosis_harbor.sandbox.sdk.faults import ApiRetry
from osmosis_harbor.settings import Settings
from osmosis_harbor.task_toml import task_config

__all__ = ["Collaborators", "EnvironmentFacts", "artifact_roots", "assemble"]


@dataclass(frozen=True)
class EnvironmentFacts:
    """What an environment's collaborators are made from, read once when Harbor makes it."""

    image: ImageSource
    environment_id: str
    plan: SandboxPlan
    workdirs: tuple[str, ...]  # where the agent works (the guard's check looks there)
    records_exec_results: bool  # the SDK's results cross an API (``exec_records.py``)
    settings: Settings
    logger: logging.Logger


@dataclass(frozen=True)
class Collaborators:
    session: SandboxSession
    routes: TransferRoutes
    preparation: PreparationElider
    images: ImageResolver
    creator: SandboxCreator
    guard: VerifierGuardExecs
    records: ExecRecorder
    pipeline: CommandPipeline


def assemble(state: EnvironmentState, context: TrialContext, facts: EnvironmentFacts) -> Collaborators:
    """The collaborators of one environment's sandbox."""
    current, logger, agent = facts.settings, facts.logger, context.role is Role.AGENT
    session = SandboxSession(state, LossGuard(state, context.role, context.record_loss, ApiRetry.of(current)))
    guard = VerifierGuardExecs(
        context.guard,
        facts.image.dockerfile,
        state,
        platform=facts.image.platform,
        workdirs=list(facts.workdirs),
        launch=session.launch,
        guarded=session.guarded,
        write_bytes=session.write_bytes,
        config=current,
    )
    records = ExecRecorder(state, guard.dispatch, session.require, current, enabled=facts.records_exec_results)
    files = FileCalls(
        raw_shell=functools.partial(raw_shell, records),
        write_bytes=session.write_bytes,
        read_bytes=session.read_bytes,
    )
    companions = artifact_roots(facts.image.environment_dir.parent) if agent else ()
    routes = TransferRoutes(state, session.guarded, files, logger, current, companions, fresh_verifier=not agent)
    preparation = PreparationElider(routes)
    images = ImageResolver(facts.image, facts.environment_id, context.owner.builds, logger)
    creator = SandboxCreator(state, context, facts.plan, images.prepare, logger, current)
    pipeline = CommandPipeline(guard, preparation, routes, records, session)
    return Collaborators(session, routes, preparation, images, creator, guard, records, pipeline)


def artifact_roots(task_dir: Path) -> tuple[str, ...]:
    """The task's declared artifacts that Harbor downloads whole from the agent's sandbox after
    its run (absolute paths outside ``/logs``, no exclusions, the main container): fetched in
    the same archive as ``/logs`` on the SkyPilot path (``exec_archives.py``). Read through the
    one ``task.toml`` parser (``task_toml.task_config``)."""
    try:
        artifacts = task_config(task_dir).artifacts
    except (OSError, DatasetError):  # Harbor's own trial reports a broken task.toml
        return ()
    roots = []
    for artifact in artifacts:
        source, plain = (artifact, True) if isinstance(artifact, str) else (artifact.source, not artifact.exclude)
        if plain and getattr(artifact, "service", None) in (None, "main") and source.startswith("/"):
            path = posixpath.normpath(source)
            if path != "/" and not (path == "/logs" or path.startswith("/logs/")):
                roots.append(path)
    return tuple(dict.fromkeys(roots))
