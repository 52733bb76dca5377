"""Oracle validation of Harbor datasets: every task's reference solution must score 1.0.

Each task runs as a real Harbor trial through ``TrialQueue`` in a sandbox (local Docker
or SkyPilot), with Harbor's ``oracle`` agent (``solution/solve.sh``) and Harbor's verifier
(``tests/test.sh``). Harbor reports a failing ``solve.sh`` as a low reward rather than an
exception, so a task passes only when its reward is exactly 1.0 and nothing failed.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from harbor.models.trial.config import (
    AgentConfig,
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
)
from harbor.trial.hooks import TrialEvent, TrialHookEvent
from harbor.trial.queue import TrialQueue

from osmosis_harbor import settings
from osmosis_harbor.audit import AuditFinding, EnvironmentAudit
from osmosis_harbor.errors import ConfigError, DatasetError, TaskResolutionError
from osmosis_harbor.harbor_compat import error_policies
from osmosis_harbor.harbor_compat import fastpaths as harbor_fastpaths
from osmosis_harbor.sandbox.environment.grouping import declares_no_network, pool_refusal
from osmosis_harbor.sandbox.guard import Allowance, GuardPlan, GuardSession
from osmosis_harbor.sandbox.images.builds import local_image_labels
from osmosis_harbor.sandbox.options import IMPORT_PATH, SandboxOptions, environment_label
from osmosis_harbor.sandbox.owner.context import SandboxOwner, add_guard_hooks, guard_scope, owner_scope
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.tasks.carried import add_carried_hooks
from osmosis_harbor.tasks.discovery import TaskRef, check_task
from osmosis_harbor.tasks.materialize import MaterializedTask, prepare_task
from osmosis_harbor.tasks.verification import Verification, VerificationMode, decide_verification
from osmosis_harbor.tasks.verifier_allowance import guard_plan, save_recorded
from osmosis_harbor.trials.contract_files import ContractBounds
from osmosis_harbor.trials.explain import explain
from osmosis_harbor.trials.job import write_job_dir
from osmosis_harbor.trials.naming import trial_name
from osmosis_harbor.trials.reading import TrialPhase, read_trial
from osmosis_harbor.trials.verdict import EXPECTED_REWARD, judge
from osmosis_harbor.validate.audit import audit_findings, refuse_audit_errors
from osmosis_harbor.validate.causes import note_causes
from osmosis_harbor.validate.lint import (
    LintMode,
    lint_dataset,
    refuse_lint_errors,
)
from osmosis_harbor.validate.report import TaskValidation, ValidationReport

ProgressCallback = Callable[[str, str], None]  # (task id, stage)


def _row_for_result(
    task: TaskRef, result, trial_dir: Path, keep: bool, agent: str, bounds: ContractBounds
) -> TaskValidation:
    reading = read_trial(result, trial_dir, bounds)
    verdict = explain(judge(reading, agent), reading, trial_dir)
    return TaskValidation(
        id=task.id,
        passed=verdict.passed,
        reward=reading.reward,
        rewards=reading.rewards,
        failed_phase=verdict.failed_phase,
        error=verdict.error,
        timings_sec=reading.timings_sec,
        steps=verdict.steps,
        trial_dir=str(trial_dir) if keep else None,
    )


def _checks(task: TaskRef) -> bool:
    try:
        check_task(task)
    except DatasetError:
        return False
    return True


def _guard_verdict(task: TaskRef, row: TaskValidation, guard: GuardSession, config: settings.Settings) -> None:
    """The guard's word on a validated task: a tampered verifier environment fails it (with
    ``nop``, a test that passes an untouched sandbox is caught either way); a passing oracle run
    records what its solution changed and left listening as the task's allowance."""
    if guard.tampered is not None:
        row.passed, row.failed_phase, row.error = False, TrialPhase.VERIFIER.value, str(guard.tampered)
        return
    if guard.plan.record_allowance and row.passed and guard.checks:
        recorded = Allowance()
        for check in guard.checks:
            recorded = recorded.merged(Allowance.recorded(check.report))
        save_recorded(task.path, recorded, config)


def _pool_note(task: TaskRef, options: SandboxOptions) -> str | None:
    """What the task's trial decides for itself (``grouping.pool_refusal``): a warm pool that
    cannot serve it is not claimed, and the report says so."""
    if not options.pool:
        return None
    from harbor.models.task.task import Task

    return pool_refusal(options, no_network=declares_no_network(Task(task.path).config.environment))


def _fresh_copy(task: TaskRef, dest: Path, verification: Verification) -> MaterializedTask:
    """The task as training runs it with a fresh verifier: a copy whose verifier is Harbor's
    separate mode, carrying what ``verification`` names (the solution kept for the oracle)."""
    return prepare_task(task.path, dest, keep_solution=True, fresh_verifier=verification.carried)


async def validate_tasks(
    tasks: Sequence[TaskRef],
    *,
    environment: EnvironmentConfig,
    agent: str = "oracle",
    n_concurrent: int = 4,
    trials_dir: Path | None = None,
    keep_trials: bool = False,
    on_progress: ProgressCallback | None = None,
    lint: LintMode = LintMode.OFF,
    max_concurrent_starts: int | None = None,
) -> ValidationReport:
    """Run every task through Harbor's ``TrialQueue`` and judge it by its rewards.

    With the ``oracle`` agent a task passes at reward 1.0 (its solution works); with
    ``nop`` at 0.0 (its tests do not pass an untouched sandbox). Multi-step and
    multi-channel rewards follow the rules in ``osmosis_harbor.trials.verdict``.

    Invalid tasks are reported (phase ``task``) without starting a sandbox; so are tasks
    with Harbor lint errors under ``lint=strict``. A kept ``trials_dir`` is a Harbor job
    directory (``trials_dir`` itself, or a job inside a temp dir). Whatever
    happens, including cancellation, no sandbox this run created outlives the call.
    At most ``max_concurrent_starts`` sandboxes start at once (default: the SDK's own bound).
    """
    if agent not in EXPECTED_REWARD:
        raise ConfigError(
            f"validate runs the oracle (reference solutions must score 1) or nop "
            f"(an untouched sandbox must score 0), not {agent!r}"
        )
    settings.use_bundled_model_prices()
    run_settings = settings.current()  # once for the run, carried to its parts
    started = time.monotonic()
    notify = on_progress or (lambda _id, _stage: None)
    owns_dir = trials_dir is None
    job_name = f"validate-{agent}-{datetime.now():%Y-%m-%d__%H-%M-%S}"
    root = Path(trials_dir or Path(tempfile.mkdtemp(prefix="osmosis-harbor-validate-")) / job_name)
    root.mkdir(parents=True, exist_ok=True)
    rows: dict[str, TaskValidation] = {}
    runnable: list[tuple[TaskRef, TrialConfig]] = []
    guards: dict[str, GuardPlan | None] = {}
    pool_notes: dict[str, str | None] = {}
    options = SandboxOptions.of(environment)
    ours = environment.import_path == IMPORT_PATH  # our SDKs: lint also names what training refuses there
    findings = lint_dataset(list(tasks), lint, run_settings, options.impl if ours else None)
    leaks: dict[str, list[AuditFinding]] = {}
    audits: list[EnvironmentAudit] | None = None
    impl = options.impl
    bounds = ContractBounds.of(run_settings)  # what the trials' files are read within
    # This run's sandboxes, start bound and builds, not another run's or a backend's.
    owner = SandboxOwner.make(
        "validate", config=run_settings, starts=SandboxStarts(max_concurrent_starts or impl.max_concurrent_starts)
    )
    if lint != LintMode.OFF:  # the leak audit: one sandbox per environment, before any trial
        auditable = [t for t in tasks if _checks(t)]
        try:
            with owner_scope(owner):
                report, leaks = await audit_findings(
                    auditable, environment, run_settings, n_concurrent=max(1, n_concurrent), on_progress=notify
                )
        except BaseException:  # cancelled: nothing this run made outlives it
            await asyncio.shield(owner.close())
            if owns_dir:
                shutil.rmtree(root.parent, ignore_errors=True)
            raise
        audits = report.environments
    modes: dict[str, Verification] = {}
    copies: Path | None = None  # the fresh-verifier copies of tasks (removed at the end)
    try:
        for task in tasks:
            try:
                check_task(task)
                if lint == LintMode.STRICT:
                    refuse_lint_errors(task, findings[task.id])
                    refuse_audit_errors(task, leaks.get(task.id, []))
                # Training's decision: a fresh verifier's sandbox, or the agent's under the guard.
                modes[task.id] = verification = decide_verification(task.path, config=run_settings)
                path = task.path
                if verification.mode is VerificationMode.FRESH:
                    copies = copies or Path(tempfile.mkdtemp(prefix="osmosis-harbor-validate-tasks-"))
                    path = (
                        await asyncio.to_thread(
                            _fresh_copy, task, copies / str(len(modes)) / task.path.name, verification
                        )
                    ).path
                elif verification.mode is VerificationMode.SHARED:
                    # Harbor's oracle and nop are native agents; the oracle's run records the allowance.
                    guards[task.id] = guard_plan(
                        task.path, native_agent=True, record=agent == "oracle", config=run_settings
                    )
            except (DatasetError, TaskResolutionError) as exc:
                rows[task.id] = TaskValidation(
                    id=task.id, passed=False, failed_phase=TrialPhase.TASK.value, error=str(exc)
                )
                notify(task.id, "invalid")
                continue
            pool_notes[task.id] = _pool_note(task, options)
            config = TrialConfig(
                task=TaskConfig(path=path),
                trial_name=trial_name(task.id, max_slug=32, fallback="task"),
                trials_dir=root,
                agent=AgentConfig(name=agent),
                environment=environment,
            )
            runnable.append((task, config))
    except BaseException:  # the copies made so far go too
        if copies is not None:
            shutil.rmtree(copies, ignore_errors=True)
        raise

    by_trial = {config.trial_name: task.id for task, config in runnable}
    stages = {
        TrialEvent.START: "queued",
        TrialEvent.ENVIRONMENT_START: "environment",
        TrialEvent.AGENT_START: "agent",
        TrialEvent.VERIFICATION_START: "verifier",
    }

    def hook_for(stage: str):
        async def hook(event: TrialHookEvent) -> None:
            notify(by_trial.get(event.trial_name, event.trial_name), stage)

        return hook

    harbor_fastpaths.install(run_settings)  # Harbor's per-trial task checks, same answers, less host CPU
    error_policies.install()  # Harbor 0.26 retries and grades our trial errors as their category says
    queue = TrialQueue(n_concurrent=max(1, n_concurrent))
    for event, stage in stages.items():
        queue.add_hook(event, hook_for(stage))
    add_guard_hooks(queue)
    add_carried_hooks(queue)

    async def run_one(task: TaskRef, config: TrialConfig) -> None:
        trial_dir = root / config.trial_name
        plan = guards.get(task.id)
        guard = GuardSession(plan) if plan is not None else None
        try:
            with guard_scope(guard):
                result = await queue.submit(config)
        except Exception as exc:  # Trial.create errors escape the queue's coroutine
            rows[task.id] = TaskValidation(
                id=task.id,
                passed=False,
                failed_phase=TrialPhase.ENVIRONMENT.value,
                error=f"{type(exc).__name__}: {exc}".splitlines()[0],
            )
        else:
            # Reading the trial's output files is file work: off the event loop.
            rows[task.id] = await asyncio.to_thread(
                _row_for_result, task, result, trial_dir, keep_trials, agent, bounds
            )
            if guard is not None:
                await asyncio.to_thread(_guard_verdict, task, rows[task.id], guard, run_settings)
        notify(task.id, "passed" if rows[task.id].passed else "failed")

    try:
        with owner_scope(owner):  # its trials' tasks inherit it
            async with asyncio.TaskGroup() as group:
                for task, config in runnable:
                    group.create_task(run_one(task, config))
    finally:
        try:
            # Trials stop their own sandboxes, including on cancellation; this sweep catches
            # anything a cancelled start left behind so nothing outlives the command.
            await asyncio.shield(owner.close())
        finally:  # a second cancellation (Ctrl-C twice) ends the wait, not the temp dir's removal
            if copies is not None:
                shutil.rmtree(copies, ignore_errors=True)
            if owns_dir and not keep_trials:
                shutil.rmtree(root.parent, ignore_errors=True)
    kept = keep_trials or not owns_dir
    if kept:
        await asyncio.to_thread(
            write_job_dir,
            root,
            [config for _, config in runnable],
            agent=AgentConfig(name=agent),
            environment=environment,
            n_concurrent=max(1, n_concurrent),
        )

    ordered = [rows[t.id] for t in tasks if t.id in rows]
    for row in ordered:
        row.lint = findings.get(row.id)
        row.pool_note = pool_notes.get(row.id)
        row.audit = leaks.get(row.id) if audits is not None else None
        row.verification = modes[row.id].as_dict() if row.id in modes else None
    await asyncio.to_thread(
        note_causes, ordered, tasks, force_build=environment.force_build, labels_of=local_image_labels
    )
    passed = sum(1 for r in ordered if r.passed)
    env_name = environment_label(environment)
    return ValidationReport(
        passed=passed,
        failed=len(ordered) - passed,
        agent=agent,
        environment=env_name,
        wall_sec=round(time.monotonic() - started, 3),
        tasks=ordered,
        job_dir=str(root) if kept else None,
        audits=audits,
    )
