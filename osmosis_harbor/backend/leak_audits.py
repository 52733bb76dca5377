"""The leak audit of a dataset task that no prewarm audited, on its first rollout.

One audit per environment: on the first rollout of any task of an environment not yet audited,
every dataset task whose ``environment/`` has the same content hash is audited together, in one
sandbox of the image its trials run (the task copy a rollout materializes, so the build is the
trials' own), and the result is kept for every later rollout of those tasks. Rollouts of the same
environment wait for that one audit; a cancelled rollout ends its audit (the sandbox is stopped),
and the next rollout runs it. An audit that could not run leaves ``audit-incomplete`` warnings:
the task is admitted, and ``/health`` shows why it was not proven clean. With
``allow_leaking_tasks`` nothing is audited on first use (nothing would be refused).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from harbor.models.trial.config import EnvironmentConfig

from osmosis_harbor.audit import AuditSubject, audit_sandbox
from osmosis_harbor.audit.findings import incomplete
from osmosis_harbor.audit.run import environment_id_of, sandbox_environment
from osmosis_harbor.backend.task_copies import TaskCopies
from osmosis_harbor.prewarm.prewarmed import Prewarmed
from osmosis_harbor.tasks.refs import ResolvedTask
from osmosis_harbor.tasks.resolver import TaskResolver

__all__ = ["FirstUseAudits"]


class FirstUseAudits:
    """See the module docstring; results go to ``Prewarmed.leaks``, beside prewarm's."""

    def __init__(
        self,
        *,
        prewarmed: Prewarmed,
        resolver: TaskResolver,
        copies: TaskCopies,
        environment_config: EnvironmentConfig,
    ) -> None:
        self.prewarmed = prewarmed
        self.resolver = resolver
        self.copies = copies
        self.environment_config = environment_config
        self._environments: dict[str, str] | None = None  # dataset task id -> its environment's hash
        self._locks: dict[str, asyncio.Lock] = {}

    async def refusal(self, resolved: ResolvedTask) -> str | None:
        """Why ``resolved`` is refused for what its sandbox leaks (None: admitted)."""
        if resolved.source != "dataset" or self.copies.options.settings.allow_leaking_tasks:
            return None
        if resolved.task_id not in self.prewarmed.leaks:
            environments = await self._environment_ids()
            key = environments.get(resolved.task_id)
            if key is None:  # a task outside the dataset's listing: its own environment
                key = await asyncio.to_thread(environment_id_of, resolved.path)
            async with self._locks.setdefault(key, asyncio.Lock()):
                if resolved.task_id not in self.prewarmed.leaks:  # the rollout before us may have done it
                    peers = sorted({t for t, k in environments.items() if k == key} | {resolved.task_id})
                    await self._audit(resolved, peers)
        return self.prewarmed.leak_refusal(resolved.task_id)

    async def _environment_ids(self) -> dict[str, str]:
        if self._environments is None:

            def hashes() -> dict[str, str]:
                found: dict[str, str] = {}
                for task_id in self.resolver.task_ids():
                    path = self.resolver.tasks_dir / task_id
                    try:
                        found[task_id] = environment_id_of(path)
                    except Exception:  # an invalid task is refused on its own; it has no peers
                        continue
                return found

            self._environments = await asyncio.to_thread(hashes)
        return self._environments

    async def _audit(self, resolved: ResolvedTask, peers: list[str]) -> None:
        subjects: list[AuditSubject] = []
        for task_id in peers:
            peer = resolved if task_id == resolved.task_id else None
            if peer is None:
                try:
                    peer = await self.resolver.resolve(self.copies.metadata_for_task(task_id))
                except Exception:
                    continue
            subjects.append(AuditSubject(task_id=task_id, path=peer.path))
        work = Path(tempfile.mkdtemp(prefix="osmosis-harbor-first-audit-"))
        try:
            copy = await asyncio.to_thread(self.copies.materialize, resolved, work / "task", request=None)
            env = sandbox_environment(copy.path, self.environment_config, work)
            await env.start(force_build=False)
            try:
                audit = await audit_sandbox(
                    env,
                    subjects,
                    config=self.copies.options.settings,
                    environment_id=await asyncio.to_thread(environment_id_of, copy.path),
                )
            finally:
                await env.stop(delete=True)
            found = {s.task_id: audit.for_task(s.task_id) for s in subjects}
        except Exception as exc:  # the audit could not run: admitted, and /health says why
            text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            ids = [s.task_id for s in subjects]
            found = {f.task_id: [f] for f in incomplete(ids, "/", f"the audit could not run: {text}")}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for subject in subjects:
            self.prewarmed.leaks[subject.task_id] = found.get(subject.task_id, [])
