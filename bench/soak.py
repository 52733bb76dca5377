"""Fault-injection soak: N graded rollouts through the real server, about 10 % of them hit by
a fault, and every one must end exactly as its plan says, with nothing left behind.

Why: a trainer submits rollouts by the thousand, and some of them meet sandboxes killed by
the infrastructure, cancels, agent timeouts and broken graders. Each must still reach the
controller with the right terminal state and error category (a lost sandbox is
``internal_error``, not the workflow's fault; a grader's ``ValueError`` is
``validation_error``), a rewarded rollout must carry the grader's reward, no rollout may be
lost, no sandbox or temporary directory may outlive the run, and no retained file may hold
any rollout's API key, whichever way its trial ended.

How: one ``HarborBackend`` (``TrialQueue(n_concurrent=4)``, ``infra_retries=1``, the
fixture project's ``SoakWorkflow`` and ``SoakGrader``, the template task without tests so
each graded rollout verifies in a fresh sandbox) behind the real osmosis server, driven by
the osmosis ``RolloutClient`` as a controller would. All N rollouts are submitted at once,
each with its own API key; the queue bounds the concurrency. Each rollout's plan follows
from the seed: half of the normal ones answer right (reward 1), half wrong (reward 0); the
faulted ones block on a FIFO in the sandbox (which is also how the soak knows the workflow
runs) until the soak, playing the infrastructure, ``docker kill``\\ s the sandbox (twice:
``internal_error`` after the retry; once, then releases the retry: success), or cancels
the rollout through ``POST /rollout/cancel``, or the agent timeout fires; a grader error
is asked for by the label. Every workflow first writes its key into ``/logs/agent`` and
its artifacts (raw, JSON-escaped, URL-encoded). The soak then checks each result against
its plan, that accepted == terminal, and that no sandbox of this process, no temporary
directory (the run uses a private ``TMPDIR``), no unscrubbed marker and no spelling of any
key (the shim's ``Redactor`` rules, file names included) is left in the trials directory
or the server's ``~/.osmosis``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import httpx
from harbor.environments.skypilot import _sanitize_dns_name
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.client import RolloutClient, RolloutHandle
from osmosis_ai.rollout.types import (
    RolloutStatus,
)

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.serving.local import serve_locally
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult
from .env import PROJECT, TEMPLATE, managed_containers, workdir
from .soak_checks import check
from .soak_plan import (  # the plan model: its own module, shared with bench.soak_emulator and the tests
    GATE,
    GRADER,
    RETRIED,
    WORKFLOW,
    Kind,
    Observed,
    Plan,
    SoakConfig,
    SoakReport,
    make_plans,
)

NAME = "soak"
TITLE = "graded rollouts with ~10 % injected faults: states, categories, leftovers, the key"


# ── the infrastructure's side: find a blocked workflow, kill, release ─────────────────────────


class Infrastructure:
    """Plays the node and the operator: acts on a rollout's sandbox once its workflow waits
    at the gate (a FIFO it made), found by the sandbox's labels."""

    def __init__(self, backend: HarborBackend) -> None:
        self.backend = backend
        self.api = docker.from_env().api

    def agent_sandbox(self, rollout_id: str) -> str | None:
        """The name of the rollout's agent sandbox while its trial runs (None while queued,
        between attempts or grading): read from the backend, no engine call."""
        status = self.backend.rollout_status(rollout_id)
        if not status or status["status"] is not RolloutStatus.RUNNING or not status.get("trial_name"):
            return None
        return _sanitize_dns_name(f"hb-{status['trial_name']}__env")

    def gated(self, name: str, not_in: frozenset[str]) -> str | None:
        """The id of the running sandbox ``name`` if its workflow waits at the gate."""
        labels = [L.MANAGED_FILTER, f"{L.OWNER_PID}={os.getpid()}", f"{L.SANDBOX}={name}"]
        for container in self.api.containers(filters={"label": labels, "status": "running"}):
            if container["Id"] not in not_in and self.run(container["Id"], "test", "-p", GATE) == 0:
                return container["Id"]
        return None

    def run(self, container_id: str, *argv: str) -> int:
        try:
            exec_id = self.api.exec_create(container_id, list(argv))["Id"]
            self.api.exec_start(exec_id)
            return int(self.api.exec_inspect(exec_id)["ExitCode"])
        except docker.errors.APIError:  # the container went away while we looked
            return -1

    async def at_gate(self, rollout_id: str, handle: RolloutHandle, not_in: frozenset[str] = frozenset()) -> str:
        async def check() -> str | None:
            name = self.agent_sandbox(rollout_id)
            return await asyncio.to_thread(self.gated, name, not_in) if name else None

        found = await poll(check, stop=handle.done)
        if found is None:
            raise RuntimeError(f"{rollout_id} ended before its workflow reached the gate")
        return found

    async def kill(self, container_id: str) -> None:
        await asyncio.to_thread(self.api.kill, container_id)  # docker kill, as a lost node would

    async def release(self, container_id: str) -> None:
        if await asyncio.to_thread(self.run, container_id, "sh", "-c", f"echo go > {GATE}") != 0:
            raise RuntimeError(f"could not open the gate in {container_id[:12]}")


async def poll(check: Callable[[], Awaitable[str | None]], *, stop: Callable[[], bool]) -> str | None:
    """``check`` until it returns a value, backing off from 20 ms to 0.5 s; None once
    ``stop()`` holds. Polling a condition, never sleeping a fixed time."""
    delay = 0.02
    while not stop():
        found = await check()
        if found is not None:
            return found
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)
    return None


async def inject(
    plan: Plan, handle: RolloutHandle, infra: Infrastructure, client: RolloutClient, seen: Observed
) -> None:
    """The plan's fault, once the workflow is running (the agent timeout fires by itself,
    the grader error is asked for by the label)."""
    if plan.kind in RETRIED:
        first = await infra.at_gate(plan.rollout_id, handle)
        seen.first_start = (infra.backend.rollout_status(plan.rollout_id) or {}).get("started_at")
        await infra.kill(first)
        retry = await infra.at_gate(plan.rollout_id, handle, not_in=frozenset({first}))
        await (infra.kill(retry) if plan.kind is Kind.KILLED else infra.release(retry))
    elif plan.kind is Kind.CANCELLED:
        await infra.at_gate(plan.rollout_id, handle)
        answer = await client.cancel_rollout(plan.rollout_id)
        seen.disposition = answer.dispositions.get(plan.rollout_id)


# ── the controller's side ─────────────────────────────────────────────────────────────────────


async def drive(
    plan: Plan, client: RolloutClient, chat_url: str, config: SoakConfig, infra: Infrastructure
) -> Observed:
    """Submit one rollout, inject its fault, wait for its terminal result."""
    seen = Observed()
    started = time.perf_counter()
    try:
        handle = await client.run_rollout_async(
            initial_messages=[{"role": "user", "content": f"Answer the question.\nreply: {plan.command}"}],
            chat_completions_url=chat_url,
            rollout_id=plan.rollout_id,
            llm_api_key=plan.key,
            label=plan.label,
            grade=True,
            agent_timeout_sec=config.timeout_sec if plan.kind is Kind.TIMEOUT else None,
        )
    except Exception as exc:
        seen.error = f"admission failed: {type(exc).__name__}: {exc}"
        return seen
    seen.accepted = True
    injection = asyncio.create_task(inject(plan, handle, infra, client, seen))
    try:
        seen.result = await handle.wait_for_completion()
        seen.submit_to_result_sec = time.perf_counter() - started
    except Exception as exc:
        seen.error = f"no terminal result: {type(exc).__name__}: {exc}"
    finally:
        await settle(injection, seen)
    state = infra.backend.rollout_status(plan.rollout_id) or {}
    start = seen.first_start or state.get("started_at")
    if start and state.get("finished_at"):
        seen.run_sec = state["finished_at"] - start
    return seen


async def settle(injection: asyncio.Task[None], seen: Observed) -> None:
    if not injection.done():
        injection.cancel()
    try:
        await injection
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            raise
        seen.injection_error = "the rollout ended before its fault was injected"
    except Exception as exc:
        seen.injection_error = f"{type(exc).__name__}: {exc}"


@contextlib.asynccontextmanager
async def controller(url: str, rollouts: int) -> AsyncIterator[RolloutClient]:
    """The osmosis client with a connection per rollout (every one long-polls its result).
    Idle connections expire before uvicorn's 5 s keep-alive closes them, so that a poll is
    not sent down a connection the server is closing."""
    limits = httpx.Limits(max_connections=rollouts + 8, max_keepalive_connections=rollouts + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        client = RolloutClient(url=url, http_client=http)
        try:
            yield client
        finally:
            await client.aclose()


# httpcore's pool checks every connection it holds on each request and each response closed,
# so one pool of N long-polls costs O(N) per call, O(N^2) in all: at N=1000 that stalled the
# loop the soak shares with the server for seconds (``loop_watch.py`` caught it there). A
# trainer's controller runs elsewhere; here each client holds a few dozen connections.
ROLLOUTS_PER_CLIENT = 32


@contextlib.asynccontextmanager
async def controllers(url: str, rollouts: int) -> AsyncIterator[list[RolloutClient]]:
    """``controller``s for ``rollouts`` in all, ``ROLLOUTS_PER_CLIENT`` to each."""
    async with contextlib.AsyncExitStack() as stack:
        count = max(1, -(-rollouts // ROLLOUTS_PER_CLIENT))
        yield [await stack.enter_async_context(controller(url, ROLLOUTS_PER_CLIENT)) for _ in range(count)]


async def collect(tasks: dict[str, asyncio.Task[Observed]], deadline: float) -> dict[str, Observed]:
    """Each rollout's observation once the batch's deadline passes; one still running is
    cancelled and recorded as having no result (the soak counts it, never waits forever)."""
    await asyncio.wait(tasks.values(), timeout=deadline)
    observed = {}
    for rollout_id, task in tasks.items():
        if task.done():
            observed[rollout_id] = task.result()
        else:
            task.cancel()
            observed[rollout_id] = Observed(accepted=True, error=f"no result within {deadline:.0f} s")
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    return observed


class RetryCounter(logging.Handler):
    """Counts the result reads the osmosis client retried after a transport error (it logs
    each one): retried reads are not lost results, but they are worth seeing."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith("Retrying result read")


@dataclass
class Batch:
    observed: dict[str, Observed]
    sandboxes_at_end: list[str]  # of this process, once every rollout ended
    read_retries: int


async def drive_all(plans: list[Plan], backend: HarborBackend, chat_url: str, config: SoakConfig) -> Batch:
    """Every plan at once through the real server; what has not ended by the deadline is
    lost. The sandboxes are listed before the server's exit shuts the backend down (which
    would remove them)."""
    infra = Infrastructure(backend)
    retries = RetryCounter()
    client_log = logging.getLogger(RolloutClient.__module__)
    client_log.addHandler(retries)
    try:
        async with serve_locally(backend) as url, controllers(url, len(plans)) as clients:
            tasks = {
                p.rollout_id: asyncio.create_task(drive(p, clients[i % len(clients)], chat_url, config, infra))
                for i, p in enumerate(plans)
            }
            observed = await collect(tasks, config.deadline)
            await backend.owner.settled()  # the terminations a result does not wait for
            return Batch(observed, await asyncio.to_thread(own_sandboxes), retries.count)
    finally:
        client_log.removeHandler(retries)


# ── the run ───────────────────────────────────────────────────────────────────────────────────


@contextlib.contextmanager
def private_tempdir(path: Path) -> Iterator[Path]:
    """Temporary files of this process go to ``path`` meanwhile: whatever is left there is
    the soak's (other processes share the system temporary directory)."""
    saved = tempfile.tempdir
    tempfile.tempdir = str(path)
    try:
        yield path
    finally:
        tempfile.tempdir = saved


def graded_template(work: Path) -> Path:
    """The template task without tests/: the bundled grader is the verifier."""
    task = shutil.copytree(TEMPLATE, work / "tasks" / "template-graded")
    shutil.rmtree(task / "tests")
    return task


def make_backend(work: Path, config: SoakConfig) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=config.concurrency),
        tasks_dir=graded_template(work),
        task_mode="template",
        agent=WORKFLOW,
        workflow_config="rollout_fixtures.workflows:fixture_config",
        grader=GRADER,
        grader_config="rollout_fixtures.graders:fixture_grader_config",
        code_dir=PROJECT,
        bundles_dir=work / "bundles",
        trials_dir=work / "trials",
        environment_config=environment_config("docker"),
        cleanup_successful_trials=False,  # keep every trial: the key check reads them all
        infra_retries=config.infra_retries,
    )


def own_sandboxes() -> list[str]:
    return [c["Names"][0].lstrip("/") for c in managed_containers(os.getpid())]


async def run_soak(config: SoakConfig, work: Path) -> SoakReport:
    """The whole soak in ``work`` (left for the caller to remove); the osmosis server keeps
    its trajectories under ``$HOME/.osmosis``, which the key check reads too."""
    plans = make_plans(config)
    tmp = work / "tmp"
    tmp.mkdir(parents=True)
    chat = FakeChatServer()
    try:
        with private_tempdir(tmp):
            backend = make_backend(work, config)
            started = time.perf_counter()
            await backend.prewarm()
            prewarm_sec = time.perf_counter() - started
            started = time.perf_counter()
            try:
                batch = await drive_all(plans, backend, chat.base_url, config)
                wall = time.perf_counter() - started
            finally:
                await backend.shutdown()  # done when the server stopped; the backstop if it raised
    finally:
        chat.close()
    report = SoakReport(config, plans, batch.observed, wall, prewarm_sec, read_retries=batch.read_retries)
    check(report, work / "trials", Path.home(), tmp, batch.sandboxes_at_end)
    return report


# ── the benchmark ─────────────────────────────────────────────────────────────────────────────


def sizes(quick: bool, soak_n: int | None = None) -> SoakConfig:
    if soak_n is not None:
        return SoakConfig(rollouts=soak_n)
    return SoakConfig(rollouts=50) if quick else SoakConfig()


def to_bench(report: SoakReport) -> BenchResult:
    config = report.config
    result = BenchResult(NAME, f"{TITLE} (N={config.rollouts}, C={config.concurrency}, seed {config.seed})")
    result.add("wall time, all rollouts (prewarm excluded)", "s", [report.wall_sec])
    result.add("throughput", "rollouts/s", [report.terminal / report.wall_sec if report.wall_sec else 0.0])
    run_sec = report.by_kind("run_sec")
    for kind in Kind:
        if kind in run_sec:
            note = "the retry waits again, at the back of the queue" if kind in RETRIED else ""
            result.add(f"  trial start to terminal, {kind}", "s", run_sec[kind], note, baseline=kind is Kind.RIGHT)
    result.add(
        "  submit to result (queue wait included), all",
        "s",
        [s for samples in report.by_kind("submit_to_result_sec").values() for s in samples],
    )
    plans = Counter(p.kind for p in report.plans)
    result.info["plans"] = ", ".join(f"{plans[k]} {k}" for k in Kind)
    result.info["accepted / terminal (lost)"] = (
        f"{report.accepted} / {report.terminal} ({report.accepted - report.terminal})"
    )
    result.info["outcomes"] = ", ".join(f"{n} {name}" for name, n in sorted(report.outcomes().items()))
    result.info["prewarm (s)"] = round(report.prewarm_sec, 1)
    result.info["result reads the client retried after a transport error"] = report.read_retries
    result.info["mismatches (must be 0)"] = len(report.mismatches)
    result.info["leftovers (must be 0)"] = len(report.leftovers)
    result.info["key hits in retained files (must be 0)"] = len(report.key_hits)
    result.info["hoarded key files retained, scrubbed"] = report.hoards_scrubbed
    result.info["successes without their scrubbed hoard (must be 0)"] = len(report.unproven)
    for line in report.mismatches[:20]:
        result.warn(f"MISMATCH: {line}")
    for line in (report.leftovers + report.key_hits + report.unproven)[:20]:
        result.warn(line)
    return result


async def run(quick: bool, *, soak_n: int | None = None) -> BenchResult:
    work = workdir(NAME)
    try:
        return to_bench(await run_soak(sizes(quick, soak_n), work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
