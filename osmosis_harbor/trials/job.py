"""Kept validation trials as a Harbor job directory, so ``harbor view`` can browse them.

``harbor run`` writes ``<jobs_dir>/<job_name>/`` holding ``config.json`` (``JobConfig``),
``lock.json`` (``JobLock``), ``result.json`` (``JobResult`` without its trial results, which
live in the trial directories) and one directory per trial. ``validate`` runs its trials through
Harbor's ``TrialQueue`` without a ``Job``, so the trial directories are Harbor's but the job-level
files are written here, with Harbor's models and the values of this run; the statistics are
Harbor's own (``JobStats``, the ``Mean`` metric it applies by default, pass@k).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from uuid import uuid4

from harbor.metrics.mean import Mean
from harbor.models.job.config import JobConfig
from harbor.models.job.lock import HarborLockInfo, JobLock, TrialLock
from harbor.models.job.result import JobResult, JobStats
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TrialConfig
from harbor.models.trial.paths import TrialPaths
from harbor.models.trial.result import TrialResult
from harbor.utils.pass_at_k import compute_pass_at_k_by_evals


def _harbor_info() -> HarborLockInfo:
    try:
        return HarborLockInfo(version=version("harbor"))
    except PackageNotFoundError:
        return HarborLockInfo()


def _stats(results: list[TrialResult], n_total: int) -> JobStats:
    """Harbor's end-of-job statistics for ``results``."""
    stats = JobStats.from_trial_results(results, n_total_trials=n_total)
    rewards: dict[str, list] = defaultdict(list)
    for result in results:
        model = result.agent_info.model_info.name if result.agent_info.model_info else None
        key = JobStats.format_agent_evals_key(result.agent_info.name, model, result.source or "adhoc")
        rewards[key].append(result.verifier_result.rewards if result.verifier_result else None)
    for key, values in rewards.items():
        stats.evals[key].metrics.append(Mean().compute(values))
    for key, pass_at_k in compute_pass_at_k_by_evals(results).items():
        stats.evals[key].pass_at_k = pass_at_k
    return stats


def write_job_dir(
    job_dir: Path,
    trials: Sequence[TrialConfig],
    *,
    agent: AgentConfig,
    environment: EnvironmentConfig,
    n_concurrent: int,
) -> JobResult:
    """Write the job-level files for ``trials`` (already run in ``job_dir``) and return the result.

    Trials without a ``result.json`` (a start that failed before Harbor recorded one) count as
    neither completed nor errored, as in a Harbor job interrupted at that point.
    """
    paths = [TrialPaths(job_dir / trial.trial_name) for trial in trials]
    results = [TrialResult.model_validate_json(p.result_path.read_text()) for p in paths if p.result_path.is_file()]
    config = JobConfig(
        job_name=job_dir.name,
        jobs_dir=job_dir.parent,
        n_concurrent_trials=n_concurrent,
        agents=[agent],
        environment=environment,
        tasks=[trial.task for trial in trials],
    )
    locks = [TrialLock.model_validate_json(p.lock_path.read_text()) for p in paths if p.lock_path.is_file()]
    lock = JobLock(harbor=_harbor_info(), n_concurrent_trials=n_concurrent, retry=config.retry, trials=locks)
    now = datetime.now()
    started = min((r.started_at for r in results if r.started_at), default=now)
    finished = max((r.finished_at for r in results if r.finished_at), default=now)
    result = JobResult(
        id=uuid4(),
        started_at=started,
        updated_at=finished,
        finished_at=finished,
        n_total_trials=len(trials),
        stats=_stats(results, len(trials)),
        trial_results=results,
    )
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "config.json").write_text(config.model_dump_json(indent=4, exclude_defaults=True))
    (job_dir / "lock.json").write_text(lock.model_dump_json(indent=4, exclude_none=True))
    (job_dir / "result.json").write_text(result.model_dump_json(indent=4, exclude={"trial_results"}))
    return result


__all__ = ["write_job_dir"]
