"""``python -m bench.timeline [--sdk docker|skypilot-emulator] [--pool]``: where one graded
rollout's wall clock goes, phase by phase.

Why: the incumbent comparison gives one number per rollout (submit to result); cutting it needs
the serial waits named. This runs graded rollouts (a chat call plus the fixture project's Osmosis
grader, the incumbent benchmark's workload) through the real osmosis server and client in this
process, and times every phase the host and Harbor go through by wrapping their methods for the
duration of the run (restored afterwards): admission and plan, the trial's creation, the agent
sandbox's start, agent setup, the workflow run, the agent-phase downloads, the agent sandbox's
stop, the separate verifier sandbox's start, the artifact upload, the grader (``tests/test.sh``:
the bundle check and the grader process), the verifier's downloads, its stop, the outcome, and
the result reaching the client. Every ``exec`` is a span of its own, labelled by command. The
in-sandbox processes' own clocks (the shim's ``elapsed=`` lines) are printed beside them, so the
interpreter start-up inside an exec can be told from the work.

Spans are kept with their start so nesting can be read back; a span's offset is from the
client's ``POST /rollout``. One warm-up rollout runs first (image build, bundle), then the
timed ones; the printed timeline is the last rollout's, with each phase's median over all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_harbor.serving.local import serve_locally
from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .env import dispose, grader_elapsed, grader_task, make_backend, shim_elapsed, workdir
from .soak import controller
from .workload import GRADED_PROMPT, submit_rollout

__all__ = ["Span", "Timeline", "timeline_patches"]


@dataclass(frozen=True)
class Span:
    label: str
    started: float  # time.perf_counter()
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Timeline:
    """Spans recorded while the patches are active (any thread, any task)."""

    spans: list[Span] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, label: str, started: float, ended: float) -> None:
        with self._lock:
            self.spans.append(Span(label, started, ended))

    def take(self) -> list[Span]:
        with self._lock:
            spans, self.spans = self.spans, []
        return sorted(spans, key=lambda s: (s.started, -s.ended))


def _role(env: Any) -> str:
    return "verifier" if "__verifier__" in str(getattr(env, "session_id", "")) else "agent"


_EXEC_KINDS: tuple[tuple[str, str], ...] = (
    ("-agent", "workflow process"),
    ("/tests/test.sh", "tests/test.sh (grader)"),
    ("pip install", "bundle install (pip)"),
    ("tar ", "tar"),
    ("rm -rf", "rm -rf"),
    ("mkdir", "mkdir"),
    ("chmod", "chmod"),
    ("test -", "probe"),
)


def _exec_label(env: Any, command: str) -> str:
    kind = next((label for needle, label in _EXEC_KINDS if needle in command), command.split()[0][:30])
    return f"{_role(env)} exec: {kind}"


def _async_wrapper(original: Callable[..., Any], label: Callable[..., str], timeline: Timeline) -> Any:
    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            timeline.record(label(*args, **kwargs), started, time.perf_counter())

    return wrapper


def _sync_wrapper(original: Callable[..., Any], label: Callable[..., str], timeline: Timeline) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timeline.record(label(*args, **kwargs), started, time.perf_counter())

    return wrapper


def _fixed(text: str) -> Callable[..., str]:
    return lambda *_a, **_k: text


def _targets() -> list[tuple[Any, str, Callable[..., str], bool]]:
    """(class, method, labeller, is_async): what the timeline wraps."""
    from harbor.trial.artifact_handler import ArtifactHandler
    from harbor.trial.trial import Trial

    from osmosis_harbor.backend.attempts import TrialRunner
    from osmosis_harbor.backend.harbor_backend import HarborBackend
    from osmosis_harbor.key_custody import KeyCustody
    from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment
    from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes

    # The environment is the first positional argument; ``env=`` is a keyword of exec itself.
    def env_start(*a: Any, **k: Any) -> str:
        return f"{_role(a[0])} sandbox start (create or claim)"

    def env_stop(*a: Any, **k: Any) -> str:
        return f"{_role(a[0])} sandbox stop"

    def env_exec(*a: Any, **k: Any) -> str:
        return _exec_label(a[0], str(a[1] if len(a) > 1 else k.get("command", "")))

    def env_named(what: str) -> Callable[..., str]:
        return lambda *a, **k: f"{_role(a[0])} {what}"

    return [
        (HarborBackend, "_execute", _fixed("execute (host, whole)"), True),
        (HarborBackend, "_run", _fixed("queue + trial + outcome"), True),
        (TrialRunner, "_gated", _fixed("gate + Harbor trial (queue.submit)"), True),
        (TrialRunner, "_outcome", _fixed("outcome (read trial dir)"), False),
        (TrialRunner, "_close_trial", _fixed("close trial (seal, remove)"), False),
        (TrialRunner, "_finish", _fixed("trial result (its sandboxes go after it)"), True),
        (KeyCustody, "seal", _fixed("key scrub (seal)"), False),
        (OwnedSandboxes, "end", lambda *a, **k: f"terminate {a[1] if len(a) > 1 else k.get('name')}", True),
        (Trial, "run", _fixed("Harbor Trial.run"), True),
        (Trial, "_setup_agent_environment", _fixed("agent environment setup"), True),
        (Trial, "_setup_agent", _fixed("agent setup"), True),
        (Trial, "_run_agent_phase", _fixed("agent phase (workflow run)"), True),
        (Trial, "_download_agent_logs", _fixed("agent logs download"), True),
        (Trial, "_upload_agent_logs", _fixed("agent logs re-upload"), True),
        (Trial, "_collect_artifacts_phased", _fixed("artifacts download"), True),
        (Trial, "_stop_agent_environment", _fixed("agent environment stop"), True),
        (Trial, "_run_separate_verifier", _fixed("separate verifier (whole)"), True),
        (Trial, "_verify_with_timeout", _fixed("verifier.verify (tests, test.sh, rewards)"), True),
        (Trial, "_finalize", _fixed("trial finalize"), True),
        (ArtifactHandler, "upload_artifacts", _fixed("artifacts upload to verifier"), True),
        (SandboxEnvironment, "start", env_start, True),
        (SandboxEnvironment, "stop", env_stop, True),
        (SandboxEnvironment, "exec", env_exec, True),
        (SandboxEnvironment, "upload_dir", env_named("upload_dir"), True),
        (SandboxEnvironment, "upload_file", env_named("upload_file"), True),
        (SandboxEnvironment, "download_dir", env_named("download_dir"), True),
        (SandboxEnvironment, "download_file", env_named("download_file"), True),
    ]


@contextlib.contextmanager
def timeline_patches() -> Iterator[Timeline]:
    """Wrap the phases' methods in place for the block; restore them after."""
    timeline = Timeline()
    saved: list[tuple[Any, str, Any]] = []
    try:
        for cls, name, label, is_async in _targets():
            saved.append((cls, name, cls.__dict__.get(name)))
            original = getattr(cls, name)
            wrap = _async_wrapper if is_async else _sync_wrapper
            if isinstance(cls.__dict__.get(name), staticmethod):
                setattr(cls, name, staticmethod(wrap(original, label, timeline)))
            else:
                setattr(cls, name, wrap(original, label, timeline))
        yield timeline
    finally:
        for cls, name, before in reversed(saved):
            if before is None:
                delattr(cls, name)
            else:
                setattr(cls, name, before)


def render(spans: list[Span], origin: float, total: float, extra: dict[str, float]) -> str:
    """One line per span: offset from submit, duration, nesting shown by indentation."""
    lines = [f"{'offset':>8} {'seconds':>8}  phase"]
    open_spans: list[Span] = []
    for span in spans:
        while open_spans and span.started >= open_spans[-1].ended:
            open_spans.pop()
        depth = len(open_spans)
        lines.append(f"{span.started - origin:8.3f} {span.seconds:8.3f}  {'  ' * depth}{span.label}")
        open_spans.append(span)
    lines.append(f"{total:8.3f} {'':8}  result at the client (submit to result)")
    for name, value in extra.items():
        lines.append(f"{'':8} {value:8.3f}  {name}")
    return "\n".join(lines)


def medians(runs: list[list[Span]]) -> dict[str, float]:
    """Per label: the median over rollouts of its total seconds in one rollout."""
    per: dict[str, list[float]] = {}
    for spans in runs:
        totals: dict[str, float] = {}
        for span in spans:
            totals[span.label] = totals.get(span.label, 0.0) + span.seconds
        for label, seconds in totals.items():
            per.setdefault(label, []).append(seconds)
    return {label: statistics.median(values) for label, values in per.items()}


async def run(sdk: str, n: int, pool: bool) -> str:
    work = workdir("timeline")
    chat = FakeChatServer(default_reply="true")
    pool_kwargs: dict[str, Any] = {"pool": f"tl{int(time.time())}", "pool_size": 2} if pool else {}
    backend = make_backend(
        work,
        grader="AnswerGrader",
        sdk=sdk,
        tasks_dir=grader_task(work),
        cleanup_successful_trials=False,
        **pool_kwargs,
    )
    out: list[str] = []
    try:
        await backend.prewarm()
        async with serve_locally(backend) as url, controller(url, n + 1) as client:
            assert await submit_rollout(client, chat.base_url, GRADED_PROMPT, grade=True, timeout=None), (
                "warm-up failed"
            )
            runs: list[list[Span]] = []
            with timeline_patches() as timeline:
                for _ in range(n):
                    t0 = time.perf_counter()
                    ok = await submit_rollout(client, chat.base_url, GRADED_PROMPT, grade=True, timeout=None)
                    total = time.perf_counter() - t0
                    spans = timeline.take()
                    runs.append(spans + [Span("submit to result", t0, t0 + total)])
                    if not ok:
                        out.append(f"WARNING: a rollout did not succeed: {_last_error(work)}")
            trials = sorted((work / "trials").iterdir(), key=lambda p: p.stat().st_mtime)
            last = trials[-1].name
            extra = {
                "workflow process's own elapsed (shim)": shim_elapsed(work / "trials", last) or float("nan"),
                "grader's own elapsed (verifier shim)": grader_elapsed(work / "trials", last) or float("nan"),
            }
            header = f"== one graded rollout on {sdk}{' with a warm pool' if pool else ''}: the last of {n} =="
            out += [header, render(runs[-1][:-1], t0, total, extra)]
            out += ["", f"== medians over {n} rollouts =="]
            for label, seconds in sorted(medians(runs).items(), key=lambda kv: -kv[1]):
                out.append(f"{seconds:8.3f}  {label}")
    finally:
        await dispose(backend)
        chat.close()
        shutil.rmtree(work, ignore_errors=True)
    return "\n".join(out)


def _last_error(work: Path) -> str:
    trials = sorted((work / "trials").iterdir(), key=lambda p: p.stat().st_mtime)
    for name in ("exception.txt", "agent/workflow.log", "verifier/test-stdout.txt"):
        path = trials[-1] / name
        if path.is_file():
            return f"{name}: {path.read_text(errors='replace')[-600:]}"
    return "no trial files"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.splitlines()[0])
    parser.add_argument("--sdk", default="docker", choices=["docker", "skypilot-emulator"])
    parser.add_argument("-n", type=int, default=3, help="timed rollouts after one warm-up")
    parser.add_argument("--pool", action="store_true", help="claim from a prewarmed pool of 2")
    args = parser.parse_args(argv)
    emulator = None
    if args.sdk == "skypilot-emulator":
        from .emulator_server import start_emulator

        emulator = start_emulator("debian:trixie-slim", 0, 0, 0)
    try:
        print(asyncio.run(run(args.sdk, args.n, args.pool)))
    finally:
        if emulator is not None:
            for problem in emulator.close():
                print(f"WARNING: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
