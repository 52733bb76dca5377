"""Rollouts on the skypilot-emulator: API calls per trivial and graded rollout without archives,
and their time over the emulator's floor.

Why: SkyPilot bills every ``sky.sandbox`` call as a round trip to its API server and offers no
archive capability, so Harbor's own transfer path (a file write, an unpack exec and an rm exec
per directory) carries every upload and download. The server's own count (``/admin/stats``) is
the honest figure: it sees every call, retries and liveness checks included. Rollouts run one
at a time, after one warm-up each, so the count's delta is one rollout's.
"""

from __future__ import annotations

import shutil
import statistics
import time

from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult
from .emulator_server import EMULATOR, EmulatorRun
from .env import dispose, grader_task, make_backend, new_id, outcome_ok, run_rollout, workdir
from .overhead import ANSWER, GRADED_PROMPT

SDK_CALL_SEC = 0.080  # SkyPilot's API round trip, as the figures assume


async def measure_rollouts(result: BenchResult, run: EmulatorRun, n: int) -> None:
    work = workdir("emulator-rollouts")
    chat = FakeChatServer(default_reply="true")
    trivial = make_backend(work / "trivial", sdk=EMULATOR)
    graded = make_backend(work / "graded", sdk=EMULATOR, tasks_dir=grader_task(work), grader="AnswerGrader")
    try:
        await trivial.prewarm()
        await graded.prewarm()
        kinds = (("trivial", trivial, "go", False, None), ("graded", graded, GRADED_PROMPT, True, ANSWER))
        for kind, backend, text, grade, label in kinds:
            await run_rollout(backend, chat.base_url, new_id(f"emu-warm-{kind}"), text, grade=grade, label=label)
            await backend.owner.settled()
            seconds: list[float] = []
            calls: list[int] = []
            failures: list[str] = []
            for _ in range(n):
                before, routes = run.calls(), run.routes()
                started = time.perf_counter()
                rollout_id = new_id(f"emu-{kind}")
                outcome = await run_rollout(backend, chat.base_url, rollout_id, text, grade=grade, label=label)
                seconds.append(time.perf_counter() - started)
                await backend.owner.settled()  # its terminations, which its result does not wait for
                calls.append(run.calls() - before)
                after = run.routes()
                result.info[f"{kind} rollout: calls by route (last one)"] = {
                    k: after[k] - routes.get(k, 0) for k in sorted(after) if after[k] != routes.get(k, 0)
                }
                if not outcome_ok(outcome):
                    failures.append(str(outcome.result.err_message))
            if failures:
                result.warn(
                    f"{len(failures)} of {n} {kind} rollouts failed on the emulator; first: {failures[0][:400]}"
                )
            figure = result.add(f"{kind} rollout on the emulator: end to end", "s", seconds)
            result.add(f"{kind} rollout: API calls", "calls", calls, "no archive calls: file writes, reads and execs")
            result.headline_value(f"emulator_calls_{kind}", statistics.median(calls))
            result.headline_value(f"sdk_calls_{kind}", statistics.median(calls))  # the JSON's "emulator" key
            if kind == "graded":
                result.headline_value("sdk_sec_graded_at_80ms", round(statistics.median(calls) * SDK_CALL_SEC, 3))
            if run.floor is not None:
                ratio = result.ratio(f"{kind} rollout / emulator floor", figure, run.floor, "overhead over the floor")
                result.headline_value(f"emulator_{kind}_over_floor", ratio.value)
    finally:
        await dispose(trivial)
        await dispose(graded)
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
