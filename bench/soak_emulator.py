"""The API-fault soak on the skypilot-emulator: N graded rollouts through the real
server while the emulator's API fails about 5 % of the calls and evicts about 5 % of the
rollouts' sandboxes; every rollout must end as its plan says, with nothing left anywhere.

Why: on SkyPilot every sandbox call is a request to an API server that answers 503 or 429,
resets connections, and loses pods with their nodes. Each call has a retry rule
(``osmosis_harbor.sandbox.sdk.faults``): a fault on a safe call (``ls``, ``terminate``, file
reads and writes, ``create`` checked by ``ls``) must be invisible to the controller; a fault
on an ``exec`` that may have run loses the sandbox to the trial, which is an infra retry on a
fresh sandbox or an ``internal_error``, never the workflow's failure. And whatever happened,
no sandbox, pool or ledger entry, and no spelling of any rollout's key, may be left.

How: the Docker soak's machinery (``bench.soak``: plans, the controller, the FIFO gate, the
key and leftover checks) on a skypilot-emulator server of its own. The plans are right and
wrong answers, and evictions: the soak, as the infrastructure, evicts a gated sandbox through
the emulator (``POST /admin/evict``) once (the retry is released: success) or twice
(``internal_error``). The API faults are the emulator's seeded per-call rates (503, 429,
connection reset, on every route), plus one targeted fault per kind of call so that even a
small N meets each. A loss our code reports as an API fault must be one the server really
injected on that rollout's sandbox (the server's counts by sandbox), and a rollout may end
as ``internal_error`` only after losses explained so.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import httpx
from harbor.environments.skypilot import _sanitize_dns_name
from harbor.trial.queue import TrialQueue

from osmosis_harbor import settings
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.key_custody import MARKER
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.ledger.store import default_ledger, endpoint_for
from osmosis_harbor.serving.local import serve_locally
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from . import soak, soak_checks
from .common import BenchResult
from .emulator_server import EMULATOR, EmulatorRun, start_emulator
from .env import PROJECT, workdir
from .loop_watch import LoopWatch, watching
from .soak import Infrastructure
from .soak_plan import GATE, GRADER, WORKFLOW, Kind, Observed, Plan, SoakConfig, SoakReport, seeded_plans

NAME = "soak-emulator"
TITLE = "graded rollouts on the skypilot-emulator with ~5 % API faults and ~5 % evictions"
SANDBOX_IMAGE = os.environ.get("OSMOSIS_HARBOR_TEST_IMAGE", "debian:trixie-slim")
EVICTIONS = (Kind.KILLED, Kind.RECOVERED)
API_LOSS = "the sandbox API failed mid-call"  # environment.py's words for a fault on an unsafe call
# One of each kind of call, faulted once whatever the rates draw (path prefix, method, fault).
TARGETED: tuple[tuple[str, str, str], ...] = (
    ("/sandboxes", "POST", "reset"),  # create (the first POST /sandboxes... is a create or an exec)
    ("/sandboxes", "GET", "reset"),  # ls, a file read
    ("/sandboxes", "PUT", "503"),  # a file write
    ("/sandboxes", "DELETE", "reset"),  # terminate
    ("/execs", "GET", "429"),  # an exec's result
    ("/sandboxes", "POST", "429"),
)


@dataclass(frozen=True)
class EmulatorSoakConfig:
    """The soak's size, the emulator's fault rates (per API call) and its timing knobs."""

    rollouts: int = 500
    seed: int = 16
    eviction_rate: float = 0.05  # of the rollouts (at least one of each eviction plan)
    rate_503: float = 0.02
    rate_429: float = 0.02
    rate_reset: float = 0.01
    rate_reset_after: float = 0.01  # the call ran, its answer lost: an exec launch is relaunched
    targeted: bool = True
    concurrency: int = 4
    infra_retries: int = 1
    latency_ms: float = 20.0
    cold_create_sec: float = 0.3
    deadline_sec: float | None = None

    @property
    def base(self) -> SoakConfig:
        """The Docker soak's config the shared machinery reads (deadline, agent timeout)."""
        return SoakConfig(
            rollouts=self.rollouts,
            seed=self.seed,
            concurrency=self.concurrency,
            infra_retries=self.infra_retries,
            deadline_sec=self.deadline_sec,
        )

    @property
    def api_fault_rate(self) -> float:
        return self.rate_503 + self.rate_429 + self.rate_reset + self.rate_reset_after


def make_plans(config: EmulatorSoakConfig) -> list[Plan]:
    """Right and wrong answers, and ``eviction_rate`` of evictions (once, twice, alternately)."""
    return seeded_plans(EVICTIONS, config.rollouts, config.eviction_rate, config.seed, "esoak", "an emulator soak")


class EmulatorInfrastructure(Infrastructure):
    """The Docker soak's infrastructure, where sandboxes belong to the emulator server and an
    eviction is the emulator's own (the container is inspected directly, as an operator would:
    those looks are no API calls and meet no faults)."""

    def __init__(self, backend: HarborBackend, run: EmulatorRun) -> None:
        super().__init__(backend)
        self.emulator = run

    def gated(self, name: str, not_in: frozenset[str]) -> str | None:
        labels = [L.MANAGED_FILTER, f"{L.OWNER_PID}={self.emulator.process.pid}", f"{L.SANDBOX}={name}"]
        for container in self.api.containers(filters={"label": labels, "status": "running"}):
            if container["Id"] not in not_in and self.run(container["Id"], "test", "-p", GATE) == 0:
                return container["Id"]
        return None

    async def kill(self, container_id: str) -> None:
        name = (await asyncio.to_thread(self.api.inspect_container, container_id))["Name"].lstrip("/")
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(f"{self.emulator.url}/admin/evict/{name}")
        answer.raise_for_status()
        if answer.json().get("evicted") != name:
            raise RuntimeError(f"the emulator did not evict {name}")


def configure_faults(run: EmulatorRun, config: EmulatorSoakConfig) -> None:
    """The rates from now on (the seeded sequence restarts), and the targeted faults queued."""
    knobs = run.admin()["knobs"] | {
        "seed": config.seed,
        "rate_503": config.rate_503,
        "rate_429": config.rate_429,
        "rate_reset": config.rate_reset,
        "rate_reset_after": config.rate_reset_after,
        "retry_after_sec": 0.2,
    }
    with httpx.Client(base_url=run.url, timeout=30) as http:
        http.delete("/admin/faults").raise_for_status()  # counts from zero: prewarm's calls are not the soak's
        http.put("/admin/knobs", json=knobs).raise_for_status()
        for path, method, kind in TARGETED if config.targeted else ():
            http.post("/admin/faults", json={"kind": kind, "path": path, "method": method}).raise_for_status()


def quiet_faults(run: EmulatorRun) -> None:
    """No more faults: what is checked after the soak is checked through a calm API."""
    knobs = run.admin()["knobs"] | {"rate_503": 0.0, "rate_429": 0.0, "rate_reset": 0.0, "rate_reset_after": 0.0}
    httpx.put(f"{run.url}/admin/knobs", json=knobs, timeout=30).raise_for_status()


@dataclass
class FaultFindings:
    """What the emulator injected, and what our code made of it."""

    calls: int = 0
    injected: dict[str, int] = field(default_factory=dict)
    by_sandbox: dict[str, dict[str, int]] = field(default_factory=dict)
    evicted: int = 0  # sandboxes the emulator evicted (the soak's evictions)
    api_losses: int = 0  # losses our code put down to an API fault
    faulted_rollouts: int = 0  # rollouts one of whose sandboxes met a fault
    unexplained: list[str] = field(default_factory=list)


def trial_names(seen: Observed, lost: list[dict[str, str]]) -> list[str]:
    return [entry.get("trial_name", "") for entry in lost] + ([seen.trial_name] if seen.trial_name else [])


def losses(seen: Observed, lost: list[dict[str, str]]) -> list[str]:
    """Every loss of the rollout: the retried attempts', and the last one's when it ended lost."""
    reasons = [entry.get("error", "") for entry in lost]
    result = seen.result
    if result is not None and result.err_message and "lost" in result.err_message.lower():
        reasons.append(result.err_message)
    return reasons


def expected_mismatches(plan: Plan, seen: Observed, lost: list[dict[str, str]], faulted: bool) -> list[str]:
    """The Docker soak's comparison, where an API fault may add a lost attempt: the plan's
    result after its retries, or ``internal_error`` once the losses used them up."""
    reasons = losses(seen, lost)
    api = sum(API_LOSS in r for r in reasons)
    if api and not faulted:
        return [f"{plan.rollout_id} ({plan.kind}): lost to an API fault on a sandbox the emulator never faulted"]
    problems = soak_checks.mismatches(plan, seen)
    if not api:
        return problems
    # An API-fault loss changes the attempts count, may end the rollout lost, and may end it
    # before the soak's eviction (which then finds no gate): what remains must still hold.
    got = seen.result
    if got is None:
        return problems
    if got.err_category is not None and got.err_category.value == "internal_error":
        return [] if "was lost" in (got.err_message or "") else problems  # lost, not any internal error
    return [p for p in problems if "attempt(s)" not in p and "fault not injected" not in p]


def check_faults(report: SoakReport, home: Path, run: EmulatorRun, findings: FaultFindings) -> None:
    stats = run.admin()
    findings.calls = int(stats["calls"])
    findings.injected = dict(stats["faults"])
    findings.by_sandbox = dict(stats.get("faults_by_sandbox") or {})
    findings.evicted = len(stats.get("evicted") or [])
    extras = {rid: json.loads(p.read_text()) for rid, p in soak_checks.diagnostics(home).items()}
    faulted_names = set(findings.by_sandbox)
    for plan in report.plans:
        seen = report.observed[plan.rollout_id]
        lost = list((extras.get(plan.rollout_id) or {}).get("lost_sandboxes") or [])
        prefixes = [_sanitize_dns_name(f"hb-{t}")[:40] for t in trial_names(seen, lost) if t]
        faulted = any(n.startswith(p) for n in faulted_names for p in prefixes)
        findings.faulted_rollouts += faulted
        findings.api_losses += sum(API_LOSS in r for r in losses(seen, lost))
        report.mismatches += expected_mismatches(plan, seen, lost, faulted)
    unsafe = sum(findings.injected.get(kind, 0) for kind in ("reset", "reset-after", "hang"))
    if findings.api_losses > unsafe:
        findings.unexplained.append(
            f"{findings.api_losses} losses put down to API faults, but the emulator reset only {unsafe} calls"
        )


def pool_names(run: EmulatorRun) -> set[str]:
    from osmosis_harbor.sandbox.emulator.client import extensions

    return {p.name for p in extensions.list_pools()}


def check_leftovers(report: SoakReport, run: EmulatorRun, tmp: Path, trials: Path, pools_before: set[str]) -> None:
    """Nothing in the emulator's ``ls``, no new pool (the emulator's pools are the engine's,
    other sessions' included), nothing in the ledger, the engine or ``TMPDIR``."""
    quiet_faults(run)
    report.leftovers += [f"sandbox {s.name} in the emulator's ls" for s in run.sdk.ls()]
    report.leftovers += [f"pool {name} on the emulator" for name in sorted(pool_names(run) - pools_before)]
    current = settings.current()
    entries = default_ledger(current).entries(sdk=EMULATOR, endpoint=endpoint_for(EMULATOR, current))
    report.leftovers += [f"ledger: {e.kind} {e.name} ({e.state})" for e in entries]
    labels = [L.MANAGED_FILTER, f"{L.OWNER_PID}={run.process.pid}"]
    report.leftovers += [
        f"container {c['Names'][0].lstrip('/')}"
        for c in docker.from_env().api.containers(all=True, filters={"label": labels})
        if not c["Names"][0].lstrip("/").startswith(L.IDLE_PREFIX)
    ]
    report.leftovers += [f"temporary {p}" for p in tmp.iterdir()]
    report.leftovers += [f"unscrubbed marker {p}" for p in trials.rglob(MARKER)]


def make_backend(work: Path, config: EmulatorSoakConfig) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=config.concurrency),
        tasks_dir=soak.graded_template(work),
        task_mode="template",
        agent=WORKFLOW,
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader=GRADER,
        grader_config="rollout_fixtures.graders:fixture_grader_config",
        code_dir=PROJECT,
        bundles_dir=work / "bundles",
        trials_dir=work / "trials",
        environment_config=environment_config(EMULATOR),
        cleanup_successful_trials=False,  # keep every trial: the key check reads them all
        infra_retries=config.infra_retries,
    )


async def drive_all(
    plans: list[Plan], backend: HarborBackend, chat_url: str, config: EmulatorSoakConfig, run: EmulatorRun
) -> tuple[dict[str, Observed], int, LoopWatch]:
    """Every plan at once through the real server; what has not ended by the deadline is lost.
    The loop they share is watched (``loop_watch.py``): a late answer is a stall, or not."""
    infra = EmulatorInfrastructure(backend, run)
    retries = soak.RetryCounter()
    client_log = soak.logging.getLogger(soak.RolloutClient.__module__)
    client_log.addHandler(retries)
    base = config.base
    try:
        async with watching() as watch, serve_locally(backend) as url, soak.controllers(url, len(plans)) as clients:
            tasks = {
                p.rollout_id: asyncio.create_task(soak.drive(p, clients[i % len(clients)], chat_url, base, infra))
                for i, p in enumerate(plans)
            }
            return await soak.collect(tasks, base.deadline), retries.count, watch
    finally:
        client_log.removeHandler(retries)


@dataclass
class EmulatorSoak:
    report: SoakReport
    findings: FaultFindings
    watch: LoopWatch


async def run_soak(config: EmulatorSoakConfig, work: Path, run: EmulatorRun) -> EmulatorSoak:
    """The whole soak in ``work`` on the emulator server ``run`` (both left to the caller)."""
    plans = make_plans(config)
    tmp = work / "tmp"
    tmp.mkdir(parents=True)
    chat = FakeChatServer()
    pools_before = await asyncio.to_thread(pool_names, run)
    try:
        with soak.private_tempdir(tmp):
            backend = make_backend(work, config)
            started = time.perf_counter()
            await backend.prewarm()
            prewarm_sec = time.perf_counter() - started
            await asyncio.to_thread(configure_faults, run, config)
            started = time.perf_counter()
            try:
                observed, read_retries, watch = await drive_all(plans, backend, chat.base_url, config, run)
                wall = time.perf_counter() - started
            finally:
                await backend.shutdown()
    finally:
        chat.close()
    report = SoakReport(config.base, plans, observed, wall, prewarm_sec, read_retries=read_retries)
    trials, home = work / "trials", Path.home()
    soak_checks.read_attempts(report, home)
    findings = FaultFindings()
    await asyncio.to_thread(check_faults, report, home, run, findings)
    await asyncio.to_thread(check_leftovers, report, run, tmp, trials, pools_before)
    report.key_hits = soak_checks.key_hits(report.plans, [trials, home / ".osmosis"])
    report.hoards_scrubbed = soak_checks.hoards_scrubbed(trials)
    report.unproven = soak_checks.unscrubbed_successes(report, trials)
    return EmulatorSoak(report, findings, watch)


# ── the benchmark ─────────────────────────────────────────────────────────────────────────────


def to_bench(result: EmulatorSoak, config: EmulatorSoakConfig) -> BenchResult:
    bench = soak.to_bench(result.report)
    bench.name = NAME
    bench.title = f"{TITLE} (N={config.rollouts}, C={config.concurrency}, seed {config.seed})"
    f = result.findings
    bench.info["API calls during the soak"] = f.calls
    bench.info["API faults injected (by kind)"] = dict(sorted(f.injected.items()))
    bench.info["API fault rate (per call)"] = round(sum(f.injected.values()) / f.calls, 4) if f.calls else 0.0
    bench.info["sandboxes evicted"] = f.evicted
    bench.info["rollouts with a faulted sandbox"] = f.faulted_rollouts
    bench.info["losses put down to an API fault (an exec's)"] = f.api_losses
    for line in f.unexplained:
        bench.warn(f"UNEXPLAINED: {line}")
    bench.info["unexplained API losses (must be 0)"] = len(f.unexplained)
    bench.info.update(result.watch.summary())
    if result.watch.stalls:
        bench.warn(
            f"the shared loop stalled {result.watch.max_lag_sec:.1f} s at worst, in:\n{result.watch.worst_stack}"
        )
    for key, value in summary(result.report).items():
        bench.headline_value(key, value)
    return bench


def summary(report: SoakReport) -> dict[str, int]:
    """The soak's verdict figures (``--out``'s top-level ``soak_emulator``): everything but
    ``n`` and ``internal_error_planned`` must be 0; planned ones are the double evictions."""
    internal = [
        plan
        for plan in report.plans
        if (got := report.observed[plan.rollout_id].result) is not None
        and got.err_category is not None
        and got.err_category.value == "internal_error"
    ]
    planned = sum(plan.kind is Kind.KILLED for plan in internal)
    return {
        "n": len(report.plans),
        "lost": report.accepted - report.terminal,
        "mismatches": len(report.mismatches),
        "leftovers": len(report.leftovers),
        "key_hits": len(report.key_hits),
        "internal_error_planned": planned,
        "internal_error_unplanned": len(internal) - planned,
    }


def sizes(quick: bool, soak_n: int | None) -> EmulatorSoakConfig:
    return EmulatorSoakConfig(rollouts=soak_n or (50 if quick else 500))


async def run(quick: bool, *, soak_n: int | None = None) -> BenchResult:
    config = sizes(quick, soak_n)
    work = workdir(NAME)
    emulator = await asyncio.to_thread(start_emulator, SANDBOX_IMAGE, config.latency_ms, config.cold_create_sec, 0.0)
    try:
        return to_bench(await run_soak(config, work, emulator), config)
    finally:
        problems = await asyncio.to_thread(emulator.close)
        shutil.rmtree(work, ignore_errors=True)
        for problem in problems:
            print(f"WARNING {problem}")
