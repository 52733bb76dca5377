"""Per-rollout orchestration overhead, against the raw sandbox floor.

Why: a rollout's useful work is the workflow (and the grader); everything else (task
copy, trial config, Harbor's trial machinery, sandbox start, bundle install, file
transfers, result reading) is overhead a trainer pays on every sample. The floor is the
least any sandboxed rollout can cost here: one ``create`` + one ``exec`` + ``terminate``
on the same engine and image. ``overhead / floor`` says how many raw sandboxes' worth of
time the orchestration costs, which stays comparable across machines.

How: ``execute()`` is called directly inside a ``RolloutContext`` (what the osmosis server
does, minus HTTP), with ``ListWorkflow`` asking the scripted policy and running its reply
``true``; ``grade=False``. overhead = end-to-end time - the in-container runner's own
elapsed time (its ``ok ... elapsed=`` log line), i.e. everything but the workflow itself.
Raw-floor cycles are interleaved with rollouts (alternating order) so drift hits both.
Every Docker SDK call is timed to show where the overhead goes. A few graded rollouts
(the task's own ``tests/test.sh``) and a few through the real server are reported too.
"""

from __future__ import annotations

import shutil
import sys
from collections import defaultdict
from dataclasses import dataclass

from osmosis_ai.rollout.client import RolloutClient

from osmosis_harbor.serving.local import serve_locally as serve
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult, stopwatch
from .env import API_KEY, dispose, make_backend, new_id, outcome_ok, run_rollout, shim_elapsed, workdir
from .floor import raw_cycle
from .trace import summarize, tracing

NAME = "overhead"
TITLE = "per-rollout orchestration overhead vs the raw sandbox floor"
GRADED_PROMPT = "Write osmosis to answer.txt\nreply: echo osmosis > answer.txt"
PHASES = ("environment", "agent_setup", "agent", "verifier", "total")


@dataclass(frozen=True)
class Sizes:
    rollouts: int
    graded: int
    server: int


def sizes(quick: bool) -> Sizes:
    return Sizes(rollouts=5, graded=2, server=1) if quick else Sizes(rollouts=12, graded=4, server=3)


async def run(quick: bool) -> BenchResult:
    size = sizes(quick)
    result = BenchResult(NAME, TITLE)
    work = workdir(NAME)
    chat = FakeChatServer(default_reply="true")
    backend = make_backend(work, n_concurrent=1, cleanup_successful_trials=False)
    trials = backend.trials_dir
    try:
        report = await backend.prewarm()
        image = report.groups_detail[0].image
        assert image, "prewarm produced no image"
        result.info["image"] = image
        result.info["prewarm built the image"] = report.built == 1

        # The first rollout of a process pays one-time costs (imports, first trial): shown apart.
        litellm_before = "litellm" in sys.modules
        with tracing() as trace:
            with stopwatch() as t:
                first = await run_rollout(backend, chat.base_url, new_id("first"))
            first_calls = summarize(trace.take())
        first_total = (first.result.extra_fields or {}).get("timings_sec", {}).get("total")
        result.info["first rollout of the process: end-to-end s"] = round(t[0], 3)
        result.info["first rollout of the process: trial total s"] = first_total
        result.info["first rollout of the process: SDK seconds"] = round(sum(s for _, s in first_calls.values()), 3)
        if first_total is not None:
            result.info["first rollout of the process: one-time host cost s (e2e - trial total)"] = round(
                t[0] - first_total, 3
            )
        result.info["first rollout imported litellm (Harbor agent init)"] = (
            not litellm_before and "litellm" in sys.modules
        )
        await raw_cycle(image)  # warm the floor path the same way

        e2e: list[float] = []
        shim: list[float] = []
        phases: dict[str, list[float]] = defaultdict(list)
        floor: dict[str, list[float]] = defaultdict(list)
        sdk_sec: dict[str, list[float]] = defaultdict(list)
        sdk_count: dict[str, list[int]] = defaultdict(list)
        sdk_total: list[float] = []
        failures: list[str] = []
        with tracing() as trace:
            for i in range(size.rollouts):
                if i % 2 == 0:
                    for k, v in (await raw_cycle(image)).items():
                        floor[k].append(v)
                trace.take()
                rid = new_id("ovh")
                with stopwatch() as t:
                    outcome = await run_rollout(backend, chat.base_url, rid)
                calls = summarize(trace.take())
                if i % 2 == 1:
                    for k, v in (await raw_cycle(image)).items():
                        floor[k].append(v)
                extra = outcome.result.extra_fields or {}
                elapsed = shim_elapsed(trials, extra.get("trial_name", ""))
                if not outcome_ok(outcome) or elapsed is None:
                    failures.append(f"{rid}: {outcome.result.status.value} {outcome.result.err_message}")
                    continue
                e2e.append(t[0])
                shim.append(elapsed)
                for phase in PHASES:
                    if phase in extra.get("timings_sec", {}):
                        phases[phase].append(extra["timings_sec"][phase])
                for label in calls.keys() | sdk_sec.keys():
                    count, seconds = calls.get(label, (0, 0.0))
                    sdk_sec[label].append(seconds)
                    sdk_count[label].append(count)
                sdk_total.append(sum(s for _, s in calls.values()))
                shutil.rmtree(trials / extra["trial_name"], ignore_errors=True)

        f_e2e = result.add("end-to-end rollout (execute)", "s", e2e)
        result.add("workflow in the sandbox (shim elapsed)", "s", shim)
        f_over = result.add(
            "orchestration overhead = e2e - workflow", "s", [a - b for a, b in zip(e2e, shim, strict=False)]
        )
        f_floor = result.add("raw floor: create + exec + terminate", "s", floor["total"], baseline=True)
        result.ratio("overhead / raw floor", f_over, f_floor)
        result.ratio("end-to-end / raw floor", f_e2e, f_floor)
        for step in ("create", "exec", "terminate"):
            result.add(f"  floor step: {step}", "s", floor[step])
        for phase in PHASES:
            if phases.get(phase):
                result.add(
                    f"  trial phase: {phase}",
                    "s",
                    phases[phase],
                    "Harbor's TrialResult timings" if phase == "total" else "",
                )
        if phases.get("total"):
            result.add(
                "  host time outside the trial = e2e - trial total",
                "s",
                [a - b for a, b in zip(e2e, phases["total"], strict=False)],
                "task copy, config, outcome reading",
            )
        result.add("  in Docker SDK calls (sum per rollout)", "s", sdk_total)
        result.add(
            "  host Python outside SDK calls = e2e - SDK",
            "s",
            [a - b for a, b in zip(e2e, sdk_total, strict=False)],
            "Harbor trial + backend bookkeeping",
        )
        for label in sorted(sdk_sec, key=lambda k: -sorted(sdk_sec[k])[len(sdk_sec[k]) // 2]):
            counts = sorted(sdk_count[label])
            result.add(f"    sdk {label}", "s", sdk_sec[label], f"{counts[len(counts) // 2]} call(s) per rollout")
        medians = {label: sorted(c)[len(c) // 2] for label, c in sdk_count.items()}
        result.info["sdk calls per rollout (median)"] = sum(medians.values())
        result.info["of which exec calls"] = sum(v for k, v in medians.items() if k.startswith("exec"))

        # Graded: the task's own tests/test.sh as verifier (Harbor uploads tests/, runs it, downloads logs).
        graded_e2e: list[float] = []
        graded_over: list[float] = []
        verifier: list[float] = []
        with tracing() as trace:
            for _ in range(size.graded):
                trace.take()
                rid = new_id("ovh-graded")
                with stopwatch() as t:
                    outcome = await run_rollout(backend, chat.base_url, rid, GRADED_PROMPT, grade=True)
                calls = summarize(trace.take())
                extra = outcome.result.extra_fields or {}
                elapsed = shim_elapsed(trials, extra.get("trial_name", ""))
                reward = outcome.result.sample.reward if outcome.result.sample else None
                if not outcome_ok(outcome) or elapsed is None or reward != 1.0:
                    failures.append(
                        f"{rid} (graded): {outcome.result.status.value} reward={reward} {outcome.result.err_message}"
                    )
                    continue
                grader = calls.get("exec: verifier tests/test.sh", (0, 0.0))[1]
                graded_e2e.append(t[0])
                graded_over.append(t[0] - elapsed - grader)
                verifier.append(extra.get("timings_sec", {}).get("verifier", float("nan")))
                shutil.rmtree(trials / extra["trial_name"], ignore_errors=True)
        if graded_e2e:
            result.add("graded rollout end-to-end (task tests/test.sh)", "s", graded_e2e)
            f_gover = result.add("graded overhead = e2e - workflow - test.sh exec", "s", graded_over)
            result.add("  trial phase: verifier", "s", verifier, "upload tests/, run, download /logs/verifier")
            result.ratio("graded overhead / raw floor", f_gover, f_floor)

        # Through the real server (HTTP admission, result long-poll, trajectory save).
        server_e2e: list[float] = []
        server_over: list[float] = []
        if size.server:
            async with serve(backend) as url:
                client = RolloutClient(url=url)
                try:
                    for _ in range(size.server):
                        rid = new_id("ovh-http")
                        with stopwatch() as t:
                            response = await client.run_rollout(
                                initial_messages=[{"role": "user", "content": "go"}],
                                chat_completions_url=chat.base_url,
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
        if failures:
            result.info["failed rollouts"] = len(failures)
            for failure in failures[:5]:
                result.warn(f"rollout failed: {failure}")
        result.notes.append(
            "overhead = end-to-end - the workflow runner's own elapsed (python start-up and "
            "imports inside the sandbox count as overhead)"
        )
    finally:
        await dispose(backend)
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    return result
