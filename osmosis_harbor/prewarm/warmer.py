"""Prewarming: everything a rollout would otherwise pay for on first traffic, done once.

Tasks are grouped by environment (the content hash of their materialized ``environment/``,
bundle-dependency patch included, plus the sandbox resources the task asks for). Once per
group: the image is built and pushed, or reused when it already exists (a second prewarm
builds nothing); the agent setup runs once in a real sandbox to prove it works (the
bundle's console script, checked against the baked bundle marker or after a pip install,
or a native agent's setup); and, when a warm pool is configured, the group's pool is created,
or adopted and resized when it exists (a pool still warming counts as made: claims wait for it
or fall back), unless the SDK's pools cannot serve the group (a task without a network on
SkyPilot: `pool_refusal`), whose trials then run cold. Per-task failures are recorded so that
``execute`` refuses those tasks with the reason; a prewarm that fails everywhere, or for a
systemic reason (engine, registry, credentials), raises so a server does not start broken.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from harbor.environments.base import BaseEnvironment
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig
from osmosis_ai.rollout.types import ExecutionRequest
from pydantic import BaseModel

from osmosis_harbor.audit import AuditSubject, EnvironmentAudit, audit_sandbox
from osmosis_harbor.audit.run import sandbox_environment
from osmosis_harbor.errors import (
    DockerEngineUnavailable,
    PrewarmError,
    SandboxSdkMissingError,
    TrialPhaseError,
)
from osmosis_harbor.prewarm.report import PrewarmGroup, PrewarmReport
from osmosis_harbor.sandbox.environment.grouping import pool_refusal
from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment
from osmosis_harbor.sandbox.options import SandboxOptions
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import current_owner
from osmosis_harbor.sandbox.owner.pools import pool_name_for
from osmosis_harbor.settings import Settings
from osmosis_harbor.tasks.materialize import MaterializedTask
from osmosis_harbor.tasks.refs import ResolvedTask
from osmosis_harbor.tasks.resolver import TaskResolver

ProgressCallback = Callable[[str, str], None]  # (group key, stage)
_SYSTEMIC_MARKERS = (
    "docker engine not reachable",
    "sky.sandbox",
    "unauthorized",
    "authentication required",
    "denied",
    "quota",
    "connection refused",
    "no such host",
    "registry unreachable",
)
_SYSTEMIC_TYPES = (DockerEngineUnavailable, SandboxSdkMissingError, PermissionError)
DETAIL_LINES = 24  # a detailed error's lines kept: one screen with the summary around it


class PrewarmTarget(Protocol):
    """What prewarm needs of a backend: its tasks, the copy a rollout runs, its sandboxes and
    its agent setup (``prewarming.Prewarming`` provides it)."""

    @property
    def resolver(self) -> TaskResolver: ...

    @property
    def environment_config(self) -> EnvironmentConfig: ...

    @property
    def settings(self) -> Settings: ...

    def metadata_for_task(self, task_id: str) -> dict[str, Any] | None: ...

    def materialize(self, task: ResolvedTask, dest: Path, *, request: ExecutionRequest | None) -> MaterializedTask: ...

    async def prove_agent_setup(
        self, environment: BaseEnvironment, *, deps_baked: bool, bundle_baked: str | None
    ) -> None: ...


class _Prepared(BaseModel):
    task_id: str
    path: Path
    source: Path  # the task as resolved: its tests/ and solution/ are what the leak audit looks for
    environment_id: str
    cpus: float | None
    memory_mb: int | None
    no_network: bool
    group_key: str
    deps_baked: bool = False
    bundle_baked: str | None = None  # the bundle key the image bakes in


def _is_systemic(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return isinstance(exc, _SYSTEMIC_TYPES) or any(m in text for m in _SYSTEMIC_MARKERS)


def _summary(exc: BaseException) -> str:
    """What a report and ``PrewarmError`` say of a failure: its first line, and for an error
    whose further lines explain it (a build's failing step, exit code and output tail; pip's
    output) those lines too, as bounded as the error made them."""
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = text.splitlines()
    if isinstance(exc, TrialPhaseError) and exc.detailed:
        return "\n".join([lines[0][:400], *lines[1:DETAIL_LINES]])
    return lines[0][:400] if lines else type(exc).__name__


async def _with_progress(notify: ProgressCallback, key: str, stage: str, timings: dict[str, float], coro):
    notify(key, stage)
    started = time.monotonic()
    try:
        return await coro
    finally:
        timings[stage] = round(time.monotonic() - started, 3)


class Warmer:
    """Runs one prewarm over a backend's tasks (see the module docstring)."""

    def __init__(
        self, backend: PrewarmTarget, *, pool_size: int | None = None, on_progress: ProgressCallback | None = None
    ) -> None:
        self.backend = backend
        self.notify: ProgressCallback = on_progress or (lambda _key, _stage: None)
        self.options = SandboxOptions.of(backend.environment_config)
        self.sdk_name = self.options.sdk
        self.pool_base = self.options.pool
        self.pool_size, _ = pools.prewarm_size(pool_size, self.options.pool_size, 1)
        self._work = Path(tempfile.mkdtemp(prefix="osmosis-harbor-prewarm-"))

    async def run(self, task_ids: Sequence[str]) -> PrewarmReport:
        started = time.monotonic()
        failed: dict[str, str] = {}
        prepared: list[_Prepared] = []
        try:
            for task_id in task_ids:
                try:
                    prepared.append(await self._prepare(task_id))
                except Exception as exc:
                    failed[task_id] = _summary(exc)
            groups: dict[str, list[_Prepared]] = {}
            for item in prepared:
                groups.setdefault(item.group_key, []).append(item)
            results = await asyncio.gather(
                *(self._warm_group(key, items) for key, items in groups.items()), return_exceptions=True
            )
        finally:
            shutil.rmtree(self._work, ignore_errors=True)
        details: list[PrewarmGroup] = []
        systemic: BaseException | None = None
        for (key, items), outcome in zip(groups.items(), results, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(
                    outcome, Exception
                ):  # a cancellation, an exit, a test's timeout: not a group's failure
                    raise outcome
                group = PrewarmGroup(
                    key=key,
                    environment_id=items[0].environment_id,
                    task_ids=[i.task_id for i in items],
                    error=_summary(outcome),
                )
                systemic = systemic or (outcome if _is_systemic(outcome) else None)
            else:
                group = outcome
            if group.error:
                failed.update({tid: f"prewarm failed: {group.error}" for tid in group.task_ids})
            details.append(group)
        report = PrewarmReport(
            groups=len(details),
            tasks=len(task_ids),
            built=sum(g.built for g in details),
            reused=sum(g.reused for g in details),
            failed=len(failed),
            wall_sec=round(time.monotonic() - started, 3),
            groups_detail=details,
            failed_tasks=failed,
        )
        if systemic is not None:
            raise PrewarmError(f"prewarm failed for a systemic reason: {_summary(systemic)}")
        if task_ids and len(failed) == len(task_ids):
            task_id, reason = next(iter(failed.items()))
            raise PrewarmError(f"prewarm failed for every task; the first, {task_id}: {reason}")
        return report

    # ── steps ────────────────────────────────────────────────────────────────
    async def _prepare(self, task_id: str) -> _Prepared:
        """Materialize the task exactly as a rollout would (so the hash matches)."""
        from harbor.environments.definition import environment_content_hash

        resolved = await self.backend.resolver.resolve(self.backend.metadata_for_task(task_id))
        dest = self._work / uuid.uuid4().hex[:10]
        materialized = self.backend.materialize(resolved, dest, request=None)
        path = materialized.path
        task = Task(path)
        env = task.config.environment
        return _Prepared(
            task_id=task_id,
            path=path,
            source=resolved.path,
            environment_id=environment_content_hash(task.paths.environment_dir, docker_image=env.docker_image),
            cpus=env.cpus,
            memory_mb=env.memory_mb,
            no_network=self._no_network(task),
            group_key=self._environment(path).group_key,  # the same key every trial's environment derives
            deps_baked=materialized.environment_patched,
            bundle_baked=materialized.bundle_baked,
        )

    @staticmethod
    def _no_network(task: Task) -> bool:
        env = task.config.environment
        mode = getattr(env, "network_mode", None)
        return str(getattr(mode, "value", mode)) == "no-network" or getattr(env, "allow_internet", True) is False

    def _environment(self, path: Path) -> SandboxEnvironment:
        env = sandbox_environment(path, self.backend.environment_config, self._work, purpose="prewarm")
        assert isinstance(env, SandboxEnvironment)
        return env

    async def _warm_group(self, key: str, items: list[_Prepared]) -> PrewarmGroup:
        group = PrewarmGroup(key=key, environment_id=items[0].environment_id, task_ids=[i.task_id for i in items])
        env = self._environment(items[0].path)
        timings = group.timings_sec
        try:
            image, built = await _with_progress(self.notify, key, "image", timings, env.prepare_image())
            group.image, group.built, group.reused = image, built, bool(image) and not built
            group.audit = await _with_progress(self.notify, key, "setup", timings, self._prove_setup(env, items))
            group.setup_ok = True
            # a group no pool can serve is no failure: its trials are created cold, as they would be
            group.pool_note = pool_refusal(self.options, no_network=items[0].no_network) if image else None
            if self.pool_base and image and group.pool_note is None:
                group.pool = pool_name_for(self.pool_base, key)
                group.pool_size = self.pool_size
                ensured = self._ensure_pool(group.pool, image, env)
                group.pool_note = await _with_progress(self.notify, key, "pool", timings, ensured)
            self.notify(key, "done")
        except Exception as exc:
            group.error = _summary(exc)
            self.notify(key, "failed")
            if _is_systemic(exc):
                raise
        return group

    async def _prove_setup(self, env: SandboxEnvironment, items: list[_Prepared]) -> EnvironmentAudit:
        """The setup proof, after the leak audit of the same fresh sandbox (what the agent sees)."""
        item = items[0]
        await env.start(force_build=False)
        try:
            subjects = [AuditSubject(task_id=i.task_id, path=i.source) for i in items]
            audit = await audit_sandbox(env, subjects, config=self.backend.settings, environment_id=item.environment_id)
            await self.backend.prove_agent_setup(env, deps_baked=item.deps_baked, bundle_baked=item.bundle_baked)
        finally:
            await env.stop(delete=True)
        return audit

    async def _ensure_pool(self, name: str, image: str, env: SandboxEnvironment) -> str | None:
        # the owner's registry: its pools are in the ledger before they exist
        owner = current_owner("prewarm's pool creation")
        return await pools.create(owner.sandboxes, self.sdk_name, name, image, self.pool_size, env.pool_shape())


__all__ = ["PrewarmTarget", "ProgressCallback", "Warmer"]
