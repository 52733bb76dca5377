"""The audit of one sandbox, and of a dataset (one sandbox per environment).

The sandbox is started from the task's real image on the chosen SDK, exactly as a trial's
(``SandboxEnvironment``: the same build, push and reuse), and read with one probe command
(``probe.py``) and the copies of its ``.git`` directories, brought back through the
environment's own bounded transfers and extracted by our extractor (never ``tarfile``). Nothing
of the task runs on the host: the history is read with dulwich (``git_history.py``). The whole
audit of one environment is bounded by ``audit_timeout_sec``; each bound hit is a finding of
its own (``audit-incomplete``), so an audit that stopped never passes for a clean one.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths
from pydantic import BaseModel

from osmosis_harbor import settings
from osmosis_harbor.audit.findings import content_findings, history_findings, incomplete
from osmosis_harbor.audit.fingerprints import MAX_LINES, Fingerprint, fingerprints
from osmosis_harbor.audit.git_history import scan_history
from osmosis_harbor.audit.models import AuditFinding, AuditReport, EnvironmentAudit, shown
from osmosis_harbor.audit.probe import Probe, ProbeResult, parse_probe
from osmosis_harbor.sandbox.options import SandboxOptions

__all__ = ["AuditSubject", "audit_sandbox", "audit_tasks", "environment_id_of"]

ProgressCallback = Callable[[str, str], None]  # (task id, stage)
_MAX_OUTPUT_BYTES = 4 * 2**20
_GREP_FILES = 20_000
_GREP_FILE_KIB = 1024


class AuditSubject(BaseModel):
    """A task whose files the audit looks for: its id and its directory on the host."""

    task_id: str
    path: Path


def environment_id_of(path: Path) -> str:
    """The content hash Harbor names the task's image by (the audit runs once per value)."""
    from harbor.environments.definition import environment_content_hash

    task = Task(path)
    docker_image = task.config.environment.docker_image
    return environment_content_hash(task.paths.environment_dir, docker_image=docker_image) or str(docker_image)


def _probe_for(prints: list[Fingerprint], timeout_sec: int, s: settings.Settings) -> Probe:
    lines: list[str] = []
    for p in prints:
        lines.extend(line for line in p.lines if line not in lines)
    return Probe(
        sizes=sorted({p.size for p in prints}),
        lines=lines[:MAX_LINES],
        max_repos=s.audit_max_repos,
        max_hashed=s.audit_max_hashed,
        max_hits=s.audit_max_hashed,
        max_grep_files=_GREP_FILES,
        max_grep_file_kib=_GREP_FILE_KIB,
        timeout_sec=max(1, timeout_sec),
        max_output_bytes=_MAX_OUTPUT_BYTES,
    )


async def _history(
    env: Any, ids: list[str], seen: ProbeResult, work: Path, deadline: float, s: settings.Settings
) -> list[AuditFinding]:
    found: list[AuditFinding] = []
    for kib, entries, git_dir in seen.repos:
        if kib * 1024 > s.audit_max_git_bytes or entries > s.audit_max_git_files:
            found.extend(
                incomplete(
                    ids,
                    git_dir,
                    f"history not read: {kib} KiB in {entries} entries is over audit_max_git_bytes "
                    f"({s.audit_max_git_bytes} bytes) or audit_max_git_files ({s.audit_max_git_files})",
                )
            )
            continue
        target = work / uuid.uuid4().hex[:12]
        try:
            await env.download_dir(git_dir, target)
        except Exception as exc:
            found.extend(incomplete(ids, git_dir, f"not copied out ({type(exc).__name__}: {str(exc)[:200]})"))
            continue
        left = max(1.0, deadline - time.monotonic())
        scan = await asyncio.to_thread(scan_history, target, max_objects=s.audit_max_objects, timeout_sec=left)
        shutil.rmtree(target, ignore_errors=True)
        if scan.unreadable and not git_dir.endswith("/.git"):
            continue  # a directory merely named *.git, not a bare repository
        found.extend(history_findings(ids, git_dir, scan))
    return found


async def audit_sandbox(
    env: Any,
    subjects: Sequence[AuditSubject],
    *,
    config: settings.Settings,
    environment_id: str = "",
    timeout_sec: float | None = None,
) -> EnvironmentAudit:
    """Audit the started sandbox of ``env`` (a ``SandboxEnvironment``) for every task in
    ``subjects`` (the tasks that share its image), within the bounds of ``config`` (the caller's
    settings). Read-only; it never stops the sandbox."""
    started = time.monotonic()
    budget = timeout_sec or config.audit_timeout_sec
    deadline = started + budget
    ids = [s.task_id for s in subjects]
    max_file = config.transfer_max_file_bytes
    prints = {s.task_id: await asyncio.to_thread(fingerprints, s.path, max_file_bytes=max_file) for s in subjects}
    audit = EnvironmentAudit(environment_id=environment_id, task_ids=ids)
    work = Path(tempfile.mkdtemp(prefix="osmosis-harbor-audit-"))
    try:
        async with asyncio.timeout(budget):
            probe = _probe_for([p for group in prints.values() for p in group], int(budget * 0.5), config)
            result = await env.exec(probe.command(), timeout_sec=int(budget * 0.6) + 1)
            seen = parse_probe(result.stdout or "", probe)
            audit.workdir = shown(seen.workdir) if seen.workdir else None
            audit.repositories = [shown(path) for _, _, path in seen.repos]
            audit.files_hashed = len(seen.hashes)
            for tool in seen.missing:
                what = (
                    "the image's grep lacks -I -H -o -F -m: no file was searched for the tests' lines"
                    if tool == "grep-options"
                    else f"the image has no {tool}: what needs it was not audited"
                )
                audit.findings.extend(incomplete(ids, "/", what))
            for what in seen.truncated:
                audit.findings.extend(incomplete(ids, "/", f"stopped at a bound: {what}"))
            audit.findings.extend(await _history(env, ids, seen, work, deadline, config))
            for subject in subjects:
                found = content_findings(subject.task_id, prints[subject.task_id], seen.hashes, seen.hits)
                audit.findings.extend(found)
    except TimeoutError:
        audit.findings.extend(incomplete(ids, "/", f"stopped at the time bound (audit_timeout_sec={budget:g})"))
    except Exception as exc:  # the sandbox failed under the audit: say so, never pass for clean
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        audit.error = text
        audit.findings.extend(incomplete(ids, "/", f"the audit could not finish: {text}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    audit.wall_sec = round(time.monotonic() - started, 3)
    return audit


def sandbox_environment(task_path: Path, environment: EnvironmentConfig, work: Path, purpose: str = "audit") -> Any:
    """The environment a trial of the task gets (its image, resources and network baseline),
    made outside a trial (``purpose`` names its session: the audit's, prewarm's). The caller
    holds an owner scope (``owner_scope``)."""
    task = Task(task_path)
    trial_paths = TrialPaths(work / f"{purpose}-{uuid.uuid4().hex[:8]}")
    trial_paths.mkdir()
    config = SandboxOptions.of(environment).for_trial(claims_pool=False).applied_to(environment)
    return EnvironmentFactory.create_environment_from_config(
        config,
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"{purpose}-{uuid.uuid4().hex[:10]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
        # the baseline a trial gives its agent environment, so a group's key is the trial's
        network_policy=task.config.environment.resolve_baseline(),
    )


async def _audit_group(
    environment_id: str, subjects: list[AuditSubject], environment: EnvironmentConfig, config: settings.Settings
) -> EnvironmentAudit:
    work = Path(tempfile.mkdtemp(prefix="osmosis-harbor-audit-env-"))
    ids = [s.task_id for s in subjects]
    try:
        env = sandbox_environment(subjects[0].path, environment, work)
        await env.start(force_build=environment.force_build)
        try:
            return await audit_sandbox(env, subjects, config=config, environment_id=environment_id)
        finally:
            await env.stop(delete=True)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        found = incomplete(ids, "/", f"the audit could not run: {text}")
        return EnvironmentAudit(environment_id=environment_id, task_ids=ids, error=text, findings=found)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def audit_tasks(
    subjects: Sequence[AuditSubject],
    *,
    environment: EnvironmentConfig,
    config: settings.Settings,
    n_concurrent: int = 2,
    on_progress: ProgressCallback | None = None,
) -> AuditReport:
    """Audit every task, one sandbox per environment (tasks sharing an image share its audit).
    Runs inside the caller's owner scope, so its sandboxes and builds are the caller's."""
    notify = on_progress or (lambda _id, _stage: None)
    groups: dict[str, list[AuditSubject]] = {}
    for subject in subjects:
        groups.setdefault(environment_id_of(subject.path), []).append(subject)
    gate = asyncio.Semaphore(max(1, n_concurrent))

    async def one(environment_id: str, members: list[AuditSubject]) -> EnvironmentAudit:
        async with gate:
            for m in members:
                notify(m.task_id, "audit")
            return await _audit_group(environment_id, members, environment, config)

    audits = await asyncio.gather(*(one(key, members) for key, members in groups.items()))
    return AuditReport(environments=list(audits))
