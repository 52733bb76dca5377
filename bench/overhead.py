"""Per-rollout orchestration overhead, against the raw sandbox floor, with and without a
simulated network latency on every sandbox SDK call.

Why: a rollout's useful work is the workflow (and the grader); everything else (task
copy, trial config, Harbor's trial machinery, sandbox start, bundle install, file
transfers, result reading) is overhead a trainer pays on every sample. The floor is the
least any sandboxed rollout can cost here: one ``create`` + one ``exec`` + ``terminate``
on the same engine and image. ``overhead / floor`` says how many raw sandboxes' worth of
time the orchestration costs, which stays comparable across machines. On SkyPilot each
SDK call is a round trip to an API server, so the same ratios are measured again with a
fixed delay per call (``bench.latency``), the floor included: that shows what the number
of calls per rollout costs there.

How: ``execute()`` is called directly inside a ``RolloutContext`` (what the osmosis server
does, minus HTTP), with ``ListWorkflow`` asking the scripted policy and running its reply.
Three kinds of rollout:

* trivial: the reply is ``true``, ``grade=False``;
* graded: the template task without ``tests/``, so the generated ``tests/test.sh`` runs the
  fixture project's Osmosis ``AnswerGrader`` (the workflow writes the expected answer);
* task tests (the older graded figure): the template's own ``tests/test.sh`` verifies.

overhead = end-to-end time - the in-container runner's own elapsed time (its
``ok ... elapsed=`` log line) - the grader's own elapsed (the verifier shim's line in
``verifier/test-stdout.txt``) or, for task tests, the ``test.sh`` exec; i.e. everything but
the work itself. Raw-floor cycles are interleaved with rollouts (alternating order) so drift
hits both. Every Docker SDK call is counted and timed to show where the overhead goes. The
first rollout of the process is reported against the steady state, and a few rollouts go
through the real server.
"""

from __future__ import annotations

import shutil
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.rollout.client import RolloutClient

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.serving.local import serve_locally as serve
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult, Figure, stopwatch
from .env import (
    API_KEY,
    dispose,
    grader_elapsed,
    grader_task,
    make_backend,
    new_id,
    outcome_ok,
    run_rollout,
    shim_elapsed,
    workdir,
)
from .floor import raw_cycle
from .latency import DEFAULT_LATENCY_MS, injected_latency
from .overhead_series import PHASES, Series, add_floor, median_or_nan, over_floor, report_series
from .trace import Call, Trace, summarize, tracing

NAME = "overhead"
TITLE = "per-rollout orchestration overhead vs the raw sandbox floor"
ANSWER = "osmosis"
GRADED_PROMPT = f"Write {ANSWER} to answer.txt\nreply: echo {ANSWER} > answer.txt"
TEST_SH = "exec: verifier tests/test.sh"


@dataclass(frozen=True)
class Sizes:
    rollouts: int  # trivial, no latency
    graded: int  # graded by the Osmosis grader, no latency
    task_tests: int  # graded by the task's own tests/test.sh
    server: int
    latency_rollouts: int
    latency_graded: int


def sizes(quick: bool) -> Sizes:
    if quick:
        return Sizes(rollouts=5, graded=3, task_tests=1, server=1, latency_rollouts=3, latency_graded=2)
    return Sizes(rollouts=12, graded=6, task_tests=3, server=3, latency_rollouts=8, latency_graded=4)


def _workflow_work(trials: Path, name: str, calls: list[Call]) -> float | None:
    return shim_elapsed(trials, name)


@dataclass(frozen=True)
class Kind:
    """One kind of rollout: what it asks, and which part of its time is the work itself."""

    name: str
    prompt: str = "go"
    grade: bool = False
    label: str | None = None
    # (trials dir, trial name, its SDK calls) -> seconds of work inside the trial, or None if unknown
    work: Callable[[Path, str, list[Call]], float | None] = _workflow_work
    reward: float | None = None  # the reward a successful rollout of this kind must get
    graded_by_grader: bool = False  # its grader's own elapsed is read from the verifier's log


def _grader_work(trials: Path, name: str, calls: list[Call]) -> float | None:
    workflow = shim_elapsed(trials, name)
    if workflow is None:
        return None
    return workflow + (grader_elapsed(trials, name) or 0.0)


def _task_tests_work(trials: Path, name: str, calls: list[Call]) -> float | None:
    workflow = shim_elapsed(trials, name)
    if workflow is None:
        return None
    return workflow + summarize(calls).get(TEST_SH, (0, 0.0))[1]


TRIVIAL = Kind("trivial")
GRADED = Kind("graded", GRADED_PROMPT, grade=True, label=ANSWER, work=_grader_work, reward=1.0, graded_by_grader=True)
TASK_TESTS = Kind("task tests", GRADED_PROMPT, grade=True, work=_task_tests_work, reward=1.0)


async def floor_cycle(image: str, floor: dict[str, list[float]]) -> None:
    for step, seconds in (await raw_cycle(image)).items():
        floor[step].append(seconds)


async def measure(
    backend: HarborBackend,
    chat_url: str,
    image: str,
    kind: Kind,
    n: int,
    trace: Trace,
    floor: dict[str, list[float]],
    failures: list[str],
) -> Series:
    """``n`` rollouts of ``kind``, each next to a raw-floor cycle (before or after, alternating)."""
    series = Series()
    trials = backend.trials_dir
    for i in range(n):
        if i % 2 == 0:
            await floor_cycle(image, floor)
        trace.take()
        rid = new_id(f"ovh-{kind.name.replace(' ', '-')}")
        with stopwatch() as t:
            outcome = await run_rollout(backend, chat_url, rid, kind.prompt, grade=kind.grade, label=kind.label)
        await backend.owner.settled()  # its terminations, which its result does not wait for
        calls = trace.take()
        if i % 2 == 1:
            await floor_cycle(image, floor)
        extra = outcome.result.extra_fields or {}
        trial = extra.get("trial_name", "")
        work = kind.work(trials, trial, calls)
        reward = outcome.result.sample.reward if outcome.result.sample else None
        if not outcome_ok(outcome) or work is None or (kind.reward is not None and reward != kind.reward):
            failures.append(
                f"{rid} ({kind.name}): {outcome.result.status.value} reward={reward} {outcome.result.err_message}"
            )
            continue
        if kind.graded_by_grader and grader_elapsed(trials, trial) is None:
            series.grader_log_missing += 1
        series.e2e.append(t[0])
        series.work.append(work)
        for phase in PHASES:
            if phase in extra.get("timings_sec", {}):
                series.phases[phase].append(extra["timings_sec"][phase])
        series.by_label.append(summarize(calls))
        series.calls.append(len(calls))
        series.sdk_total.append(sum(c.seconds for c in calls))
        shutil.rmtree(trials / trial, ignore_errors=True)
    return series


async def first_rollout(result: BenchResult, backend: HarborBackend, chat_url: str) -> float:
    """The first rollout of the process pays one-time costs (imports, first trial): shown apart."""
    litellm_before = "litellm" in sys.modules
    with tracing() as trace:
        with stopwatch() as t:
            first = await run_rollout(backend, chat_url, new_id("first"))
        await backend.owner.settled()
        first_calls = trace.take()
    first_total = (first.result.extra_fields or {}).get("timings_sec", {}).get("total")
    result.info["first rollout of the process: end-to-end s"] = round(t[0], 3)
    result.info["first rollout of the process: trial total s"] = first_total
    result.info["first rollout of the process: SDK calls"] = len(first_calls)
    if first_total is not None:
        result.info["first rollout of the process: one-time host cost s (e2e - trial total)"] = round(
            t[0] - first_total, 3
        )
    result.info["first rollout imported litellm (Harbor agent init)"] = not litellm_before and "litellm" in sys.modules
    if not outcome_ok(first):
        result.warn(f"the first rollout failed: {first.result.err_message}")
    return t[0]


async def through_server(
    result: BenchResult, backend: HarborBackend, chat_url: str, n: int, f_over: Figure, failures: list[str]
) -> None:
    """A few rollouts through the real server (HTTP admission, result long-poll, trajectory save)."""
    trials = backend.trials_dir
    server_e2e: list[float] = []
    server_over: list[float] = []
    async with serve(backend) as url:
        client = RolloutClient(url=url)
        try:
            for _ in range(n):
                rid = new_id("ovh-http")
                with stopwatch() as t:
                    response = await client.run_rollout(
                        initial_messages=[{"role": "user", "content": "go"}],
                        chat_completions_url=chat_url,
                        rollout_id=rid,
                        llm_api_key=API_KEY,
                        grade=False,
                    )
                if response.status.value != "success":
                    failures.append(f"{rid} (server): {response.status.value} {response.err_message}")
                    continue
                names = [p.name for p in trials.iterdir() if p.name.startswith(rid.replace("_", "-"))]
                elapsed = shim_elapsed(trials, names[0]) if names else None
                if elapsed is None:
                    continue
                server_e2e.append(t[0])
                server_over.append(t[0] - elapsed)
        finally:
            await client.aclose()
    if server_e2e:
        result.add("through the server: end-to-end (client view)", "s", server_e2e)
        f_sover = result.add("through the server: overhead", "s", server_over)
        result.ratio("server overhead / execute() overhead", f_sover, f_over)


async def run(quick: bool, *, latency_ms: float = DEFAULT_LATENCY_MS) -> BenchResult:
    size = sizes(quick)
    result = BenchResult(NAME, TITLE)
    work = workdir(NAME)
    chat = FakeChatServer(default_reply="true")
    backend = make_backend(work / "trivial", n_concurrent=1, cleanup_successful_trials=False)
    graded = make_backend(
        work / "graded",
        n_concurrent=1,
        cleanup_successful_trials=False,
        tasks_dir=grader_task(work),
        grader="AnswerGrader",
    )
    failures: list[str] = []
    try:
        report = await backend.prewarm()
        image = report.groups_detail[0].image
        assert image, "prewarm produced no image"
        result.info["image"] = image
        result.info["prewarm built the image"] = report.built == 1
        first_e2e = await first_rollout(result, backend, chat.base_url)
        await graded.prewarm()
        with stopwatch() as t:
            warm = await run_rollout(
                graded, chat.base_url, new_id("first-graded"), GRADED_PROMPT, grade=True, label=ANSWER
            )
        await graded.owner.settled()
        result.info["first graded rollout after its backend's prewarm: end-to-end s"] = round(t[0], 3)
        if not outcome_ok(warm):
            result.warn(f"the first graded rollout failed: {warm.result.err_message}")
        await raw_cycle(image)  # warm the floor path the same way

        floor: dict[str, list[float]] = defaultdict(list)
        with tracing() as trace:
            trivial = await measure(backend, chat.base_url, image, TRIVIAL, size.rollouts, trace, floor, failures)
            grader = await measure(graded, chat.base_url, image, GRADED, size.graded, trace, floor, failures)
            tests = await measure(backend, chat.base_url, image, TASK_TESTS, size.task_tests, trace, floor, failures)

        floor_lat: dict[str, list[float]] = defaultdict(list)
        trivial_lat, grader_lat = Series(), Series()
        if latency_ms > 0:
            with injected_latency(latency_ms), tracing() as trace:
                await raw_cycle(image)
                trivial_lat = await measure(
                    backend, chat.base_url, image, TRIVIAL, size.latency_rollouts, trace, floor_lat, failures
                )
                grader_lat = await measure(
                    graded, chat.base_url, image, GRADED, size.latency_graded, trace, floor_lat, failures
                )

        f_floor = add_floor(result, floor, "")
        f_e2e, f_over = report_series(
            result, "trivial", trivial, f_floor, work_note="workflow runner's elapsed", breakdown=True
        )
        result.ratio("trivial: end-to-end / raw floor", f_e2e, f_floor)
        f_first = result.add("first rollout of the process: end-to-end", "s", [first_e2e], "after prewarm")
        r_first = result.ratio("first rollout / steady state (trivial e2e)", f_first, f_e2e)
        _, f_gover = report_series(
            result, "graded", grader, f_floor, work_note="workflow + grader elapsed (shim log lines)", breakdown=True
        )
        if grader.grader_log_missing:
            result.notes.append(
                f"graded: {grader.grader_log_missing} rollout(s) had no grader 'ok ... elapsed=' line in "
                "verifier/test-stdout.txt; nothing was subtracted for their grader"
            )
        _, f_tover = report_series(
            result, "task tests", tests, f_floor, work_note="workflow + tests/test.sh exec", breakdown=False
        )
        result.headline_value("trivial_overhead_ratio", over_floor(f_over, f_floor))
        result.headline_value("graded_overhead_ratio", over_floor(f_gover, f_floor))
        result.headline_value("task_tests_overhead_ratio", over_floor(f_tover, f_floor))
        result.headline_value("sdk_calls_trivial", median_or_nan(trivial.calls))
        result.headline_value("sdk_calls_graded", median_or_nan(grader.calls))
        result.headline_value("agent_setup_sec", median_or_nan(trivial.phases.get("agent_setup", [])))
        result.headline_value("first_over_steady", r_first.value)

        if latency_ms > 0:
            suffix = f" @{latency_ms:g}ms"
            f_floor_lat = add_floor(result, floor_lat, suffix)
            _, f_over_lat = report_series(
                result, f"trivial{suffix}", trivial_lat, f_floor_lat, work_note="", breakdown=False
            )
            _, f_gover_lat = report_series(
                result, f"graded{suffix}", grader_lat, f_floor_lat, work_note="", breakdown=False
            )
            result.info["simulated latency per SDK call (ms)"] = latency_ms
            result.headline_value("trivial_overhead_ratio_latency", over_floor(f_over_lat, f_floor_lat))
            result.headline_value("graded_overhead_ratio_latency", over_floor(f_gover_lat, f_floor_lat))
            result.headline_value("sdk_calls_trivial_latency", median_or_nan(trivial_lat.calls))
            result.headline_value("sdk_calls_graded_latency", median_or_nan(grader_lat.calls))
            result.headline_value("sdk_seconds_trivial_latency", median_or_nan(trivial_lat.sdk_total))
            result.headline_value("sdk_seconds_graded_latency", median_or_nan(grader_lat.sdk_total))
            result.headline_value("agent_setup_sec_latency", median_or_nan(trivial_lat.phases.get("agent_setup", [])))

        if size.server:
            await through_server(result, backend, chat.base_url, size.server, f_over, failures)
        if failures:
            result.info["failed rollouts"] = len(failures)
            for failure in failures[:5]:
                result.warn(f"rollout failed: {failure}")
        result.notes.append(
            "overhead = end-to-end - the work (workflow runner's own elapsed; plus the grader's own elapsed "
            "for graded, or the tests/test.sh exec for task tests); python start-up and imports inside the "
            "sandbox count as overhead"
        )
        if latency_ms > 0:
            result.notes.append(
                f"@{latency_ms:g}ms: every sandbox SDK call (create/claim, exec launch, file and archive "
                "transfers, terminate, ls) waits that long first, in the SDK's thread; the floor below it too"
            )
    finally:
        await dispose(graded)
        await dispose(backend)
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    return result
