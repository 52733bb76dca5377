"""The in-container shim, run for real on the host.

A throwaway "bundle" package (workflows, graders, configs) is written to a
temporary directory and put on ``sys.path``; the shim's entry points are then
called in-process with the environment pointed at temporary files, and also
as subprocesses -- once through ``osmosis_harbor.shim`` and once as the
standalone top-level ``osmosis_harbor_shim`` package that bundle wheels ship,
proving it needs neither Harbor nor ``osmosis_harbor``.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from osmosis_ai.rollout import RolloutSample

from osmosis_harbor.shim import SHIM_VERSION, agent, errors, verifier
from osmosis_harbor.testing.scripted_policy import FakeChatServer

SECRET = "sk-osmosis-test-SECRET-0123456789abcdef"
BUNDLE = "shim_fake_bundle"
SHIM_SRC = Path(__file__).resolve().parents[3] / "osmosis_harbor" / "shim"
PROMPT = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 + 2?"},
]
GUIDE_SAMPLE_KEYS = {"messages", "reward", "remove_sample", "metrics", "extra_fields"}
ERROR_KEYS = {"phase", "type", "message", "category", "traceback"}

BUNDLE_WORKFLOWS = """
import asyncio
import json
import math
import os
import time
import urllib.request

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowOutput,
    RolloutSample,
    SampleSource,
    get_rollout_context,
)


class ContextConfig(AgentWorkflowConfig):
    name: str = "ctx"
    greeting: str = "hello"


context_config = ContextConfig(greeting="bonjour")
not_a_config = None


def answer(ctx, text="4"):
    return [*ctx.prompt, {"role": "assistant", "content": text}]


class OutputWorkflow(AgentWorkflow):
    async def run(self, ctx):
        return AgentWorkflowOutput(messages=answer(ctx), metrics={"steps": 1.0, "tokens": 7})


class ListWorkflow(AgentWorkflow):
    async def run(self, ctx):
        return answer(ctx)


class ListSource(SampleSource):
    def __init__(self, messages):
        self.messages = messages

    async def get_sample(self):
        return RolloutSample(
            messages=self.messages,
            trajectory_messages=None,
            metrics={"turns": 1},
            extra_fields={"framework": "custom"},
        )


class SourceWorkflow(AgentWorkflow):
    async def run(self, ctx):
        get_rollout_context().set_sample_source(ListSource(answer(ctx)))
        return None


class DictSource(SampleSource):
    async def get_sample(self):
        return {"messages": [{"role": "assistant", "content": "4"}]}


class DictSourceWorkflow(AgentWorkflow):
    async def run(self, ctx):
        get_rollout_context().set_sample_source(DictSource())


class NothingWorkflow(AgentWorkflow):
    async def run(self, ctx):
        return None


class EmptyOutputWorkflow(AgentWorkflow):
    async def run(self, ctx):
        return AgentWorkflowOutput()


class ValueErrorWorkflow(AgentWorkflow):
    async def run(self, ctx):
        raise ValueError("bad prompt shape")


class LeakyRuntimeErrorWorkflow(AgentWorkflow):
    async def run(self, ctx):
        key = get_rollout_context().api_key
        raise RuntimeError(f"upstream refused key {key} (json {json.dumps(key)})")


class SleepyWorkflow(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep(30)
        return answer(ctx)


class BlockingWorkflow(AgentWorkflow):
    async def run(self, ctx):
        time.sleep(0.5)  # blocks the loop: the deadline cannot fire in time
        return answer(ctx)


class UnknownFieldWorkflow(AgentWorkflow):
    async def run(self, ctx):
        return AgentWorkflowOutput(messages=answer(ctx), bogus=1)


class NanMetricWorkflow(AgentWorkflow):
    async def run(self, ctx):
        out = AgentWorkflowOutput(messages=answer(ctx))
        out.metrics["loss"] = math.nan  # in-place mutation escapes validation...
        return out  # ...until the backend revalidates the returned instance


class WrongTypeWorkflow(AgentWorkflow):
    async def run(self, ctx):
        return "just a string"


class ContextWorkflow(AgentWorkflow):
    async def run(self, ctx):
        assert ctx.artifacts_dir is not None
        (ctx.artifacts_dir / "notes").mkdir(exist_ok=True)
        (ctx.artifacts_dir / "notes" / "run.log").write_text(
            f"{ctx.config.greeting} {ctx.metadata['topic']}\\n"
        )
        text = f"{ctx.config.greeting}/{ctx.metadata['topic']}/{self.config is ctx.config}"
        return AgentWorkflowOutput(messages=answer(ctx, text))


class ChatWorkflow(AgentWorkflow):
    async def run(self, ctx):
        rollout = get_rollout_context()
        request = urllib.request.Request(
            rollout.chat_completions_url.rstrip("/") + "/chat/completions",
            data=json.dumps({"model": "osmosis-rollout", "messages": ctx.prompt}).encode(),
            headers={
                "Authorization": f"Bearer {rollout.api_key}",
                "Content-Type": "application/json",
            },
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def call():
            with opener.open(request, timeout=10) as response:
                return json.load(response)

        reply = await asyncio.to_thread(call)
        message = reply["choices"][0]["message"]
        return AgentWorkflowOutput(
            messages=[*ctx.prompt, message],
            metrics={"llm_calls": 1.0, "rollout_id_seen": float(rollout.rollout_id == "r-chat")},
        )


class ThreadStuckWorkflow(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.to_thread(time.sleep, 1.5)  # the thread outlives the deadline
        return answer(ctx)


class ExitingWorkflow(AgentWorkflow):
    async def run(self, ctx):
        raise SystemExit(3)


class NotAWorkflow:
    async def run(self, ctx):
        return []


class Outer:
    class InnerWorkflow(AgentWorkflow):
        async def run(self, ctx):
            return answer(ctx, "nested")
"""

BUNDLE_GRADERS = """
import asyncio

from osmosis_ai.rollout import Grader, GraderConfig


class StrictConfig(GraderConfig):
    name: str = "strict"
    bonus: float = 0.5


strict_config = StrictConfig()


def last_text(sample):
    return sample.messages[-1]["content"]


class ExactGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if last_text(ctx.sample) == ctx.label else 0.0)


class EditingGrader(Grader):
    async def grade(self, ctx):
        ctx.sample.metrics["graded"] = 1
        ctx.sample.metrics.pop("tokens", None)
        ctx.sample.extra_fields["judge"] = {"name": self.config.name, "meta": ctx.metadata}
        ctx.set_reward(0.25 + self.config.bonus)


class RemovingGrader(Grader):
    async def grade(self, ctx):
        ctx.sample.remove_sample = True


class NoRewardGrader(Grader):
    async def grade(self, ctx):
        ctx.sample.metrics["looked"] = 1


class RaisingGrader(Grader):
    async def grade(self, ctx):
        raise RuntimeError("judge crashed")


class ValueErrorGrader(Grader):
    async def grade(self, ctx):
        raise ValueError("unparseable answer")


class NanGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(float("nan"))


class SleepyGrader(Grader):
    async def grade(self, ctx):
        await asyncio.sleep(30)


class ArtifactGrader(Grader):
    async def grade(self, ctx):
        (ctx.artifacts_dir / "grader.txt").write_text(ctx.label or "")
        ctx.set_reward(1.0)
"""


# --------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundle")
    pkg = root / BUNDLE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "workflows.py").write_text(textwrap.dedent(BUNDLE_WORKFLOWS))
    (pkg / "graders.py").write_text(textwrap.dedent(BUNDLE_GRADERS))
    (pkg / "broken.py").write_text("raise RuntimeError('import-time failure')\n")
    return root


CHAT_PATH = "/rollouts/r-chat"  # a rollout-scoped endpoint under the server's /v1 base


@pytest.fixture(scope="module")
def chat_server() -> Iterator[FakeChatServer]:
    """An OpenAI-compatible chat-completions endpoint on 127.0.0.1 that answers "pong" to
    the rollout's key and 401 to anything else."""
    server = FakeChatServer(default_reply="pong", required_authorization=f"Bearer {SECRET}")
    yield server
    server.close()


def chat_url(server: FakeChatServer) -> str:
    return server.base_url + CHAT_PATH


@dataclass
class Sandbox:
    """The temporary stand-in for one sandbox's filesystem."""

    root: Path
    logs: Path
    rollout_input: Path
    grading_input: Path

    def stage(
        self,
        *,
        rollout_id: str = "r-1",
        prompt: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
        label: str | None = "4",
    ) -> None:
        prompt = PROMPT if prompt is None else prompt
        self.rollout_input.write_text(json.dumps({"rollout_id": rollout_id, "prompt": prompt, "metadata": metadata}))
        self.grading_input.parent.mkdir(parents=True, exist_ok=True)
        self.grading_input.write_text(
            json.dumps({"rollout_id": rollout_id, "label": label, "metadata": metadata, "prompt": prompt})
        )

    def read(self, relative: str) -> Any:
        return json.loads((self.logs / relative).read_text())

    def exists(self, relative: str) -> bool:
        return (self.logs / relative).exists()

    def env(self, chat_url: str) -> dict[str, str]:
        return {
            "OSMOSIS_LOGS_DIR": str(self.logs),
            "OSMOSIS_ROLLOUT_INPUT": str(self.rollout_input),
            "OSMOSIS_GRADING_INPUT": str(self.grading_input),
            "OSMOSIS_CHAT_COMPLETIONS_URL": chat_url,
            "OSMOSIS_API_KEY": SECRET,
        }

    def assert_no_secret(self) -> None:
        for path in self.root.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), f"API key leaked into {path}"


@pytest.fixture
def sandbox(
    tmp_path: Path,
    bundle_dir: Path,
    chat_server: FakeChatServer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Sandbox]:
    box = Sandbox(
        root=tmp_path,
        logs=tmp_path / "logs",
        rollout_input=tmp_path / "osmosis" / "rollout_input.json",
        grading_input=tmp_path / "tests" / "osmosis_grading_input.json",
    )
    box.rollout_input.parent.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(bundle_dir))
    for name, value in box.env(chat_url(chat_server)).items():
        monkeypatch.setenv(name, value)
    for name in ("OSMOSIS_AGENT_TIMEOUT_SEC", "OSMOSIS_GRADER_TIMEOUT_SEC"):
        monkeypatch.delenv(name, raising=False)
    box.stage()
    yield box
    box.assert_no_secret()


def run_agent(name: str, config: str | None = None, argv: list[str] | None = None) -> int:
    return agent.main(
        workflow=f"{BUNDLE}.workflows:{name}",
        workflow_config=config,
        argv=[] if argv is None else argv,
    )


def run_verifier(name: str, config: str | None = None, argv: list[str] | None = None) -> int:
    return verifier.main(
        grader=f"{BUNDLE}.graders:{name}",
        grader_config=config,
        argv=[] if argv is None else argv,
    )


def assert_error(box: Sandbox, phase: str, *, category: str, type_: str) -> dict[str, Any]:
    error = box.read(f"{phase}/error.json")
    assert set(error) == ERROR_KEYS
    assert error["phase"] == phase
    assert error["category"] == category, error
    assert error["type"] == type_, error
    assert error["traceback"].strip()
    assert "no running event loop" not in error["traceback"]  # no shim noise
    return error


# --------------------------------------------------------------------------
# agent phase: successful runs


def test_agent_output_with_metrics(sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_agent("OutputWorkflow") == 0

    sample = sandbox.read("agent/sample.json")
    assert GUIDE_SAMPLE_KEYS <= set(sample)
    assert sample["messages"] == [*PROMPT, {"role": "assistant", "content": "4"}]
    assert sample["metrics"] == {"steps": 1.0, "tokens": 7.0}
    assert sample["reward"] is None
    assert sample["remove_sample"] is False
    assert sample["extra_fields"] == {}
    assert sample["label"] is None  # the agent phase never sees the label
    rebuilt = RolloutSample.model_validate(sample)
    assert rebuilt.trajectory_messages == sample["messages"]
    assert not sandbox.exists("agent/error.json")
    # readable by a verifier running as another user
    assert (sandbox.logs / "agent" / "sample.json").stat().st_mode & 0o777 == 0o644
    trajectory = sandbox.read("agent/trajectory.json")
    assert trajectory["session_id"] == "r-1"
    assert len(trajectory["steps"]) == 3

    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"osmosis-harbor-shim[agent] v{SHIM_VERSION} ok rollout_id=r-1")


def test_agent_message_list(sandbox: Sandbox) -> None:
    assert run_agent("ListWorkflow") == 0
    sample = sandbox.read("agent/sample.json")
    assert sample["messages"][-1] == {"role": "assistant", "content": "4"}
    assert sample["metrics"] == {}


def test_agent_registered_sample_source_round_trips(sandbox: Sandbox) -> None:
    assert run_agent("SourceWorkflow") == 0
    sample = sandbox.read("agent/sample.json")
    assert sample["metrics"] == {"turns": 1}
    assert sample["extra_fields"] == {"framework": "custom"}
    # An explicit None (trajectory persistence off) must survive the trip.
    assert "trajectory_messages" in sample and sample["trajectory_messages"] is None
    rebuilt = RolloutSample.model_validate(sample)
    assert rebuilt.trajectory_messages is None
    assert not sandbox.exists("agent/trajectory.json")


def test_agent_sample_source_returning_mapping(sandbox: Sandbox) -> None:
    assert run_agent("DictSourceWorkflow") == 0
    assert sandbox.read("agent/sample.json")["messages"] == [{"role": "assistant", "content": "4"}]


def test_agent_context_config_metadata_and_artifacts(sandbox: Sandbox) -> None:
    sandbox.stage(metadata={"topic": "math"})
    assert run_agent("ContextWorkflow", f"{BUNDLE}.workflows:context_config") == 0
    sample = sandbox.read("agent/sample.json")
    assert sample["messages"][-1]["content"] == "bonjour/math/True"
    assert (sandbox.logs / "artifacts" / "notes" / "run.log").read_text() == "bonjour math\n"


def test_agent_nested_class_path(sandbox: Sandbox) -> None:
    assert run_agent("Outer.InnerWorkflow") == 0
    assert sandbox.read("agent/sample.json")["messages"][-1]["content"] == "nested"


def test_agent_calls_chat_endpoint_with_key_from_env(sandbox: Sandbox, chat_server: FakeChatServer) -> None:
    sandbox.stage(rollout_id="r-chat")
    before = len(chat_server.requests)
    assert run_agent("ChatWorkflow") == 0
    calls = chat_server.requests[before:]
    assert len(calls) == 1
    assert calls[0].path == "/v1/rollouts/r-chat/chat/completions"
    assert calls[0].authorization == f"Bearer {SECRET}"
    assert calls[0].body["messages"] == PROMPT
    sample = sandbox.read("agent/sample.json")
    assert sample["messages"][-1] == {"role": "assistant", "content": "pong"}
    assert sample["metrics"] == {"llm_calls": 1.0, "rollout_id_seen": 1.0}
    # The key was only ever in the environment: no input file holds it.
    assert SECRET not in sandbox.rollout_input.read_text()


def test_agent_removes_stale_outputs(sandbox: Sandbox) -> None:
    (sandbox.logs / "agent").mkdir(parents=True)
    (sandbox.logs / "agent" / "error.json").write_text("{}")
    assert run_agent("ListWorkflow") == 0
    assert not sandbox.exists("agent/error.json")
    (sandbox.logs / "agent" / "sample.json").write_text("{}")
    assert run_agent("ValueErrorWorkflow") == 1
    assert not sandbox.exists("agent/sample.json")


def test_agent_argv_overrides_logs_dir(sandbox: Sandbox, tmp_path: Path) -> None:
    other = tmp_path / "other-logs"
    assert run_agent("ListWorkflow", argv=["--logs-dir", str(other)]) == 0
    assert (other / "agent" / "sample.json").is_file()
    assert not sandbox.exists("agent/sample.json")


def test_agent_help_and_bad_options(sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_agent("ListWorkflow", argv=["--help"]) == 0
    assert "--rollout-input" in capsys.readouterr().out
    assert not sandbox.exists("agent/error.json")
    assert run_agent("ListWorkflow", argv=["--no-such-option"]) == 1
    error = assert_error(sandbox, "agent", category="internal_error", type_="InputError")
    assert "--no-such-option" in error["message"]


async def test_agent_inside_running_event_loop(sandbox: Sandbox) -> None:
    assert run_agent("OutputWorkflow") == 0
    assert sandbox.exists("agent/sample.json")


# --------------------------------------------------------------------------
# agent phase: failures


@pytest.mark.parametrize(
    ("workflow", "category", "type_"),
    [
        ("NothingWorkflow", "validation_error", "NoSampleError"),
        ("EmptyOutputWorkflow", "validation_error", "NoSampleError"),
        ("ValueErrorWorkflow", "validation_error", "ValueError"),
        ("UnknownFieldWorkflow", "validation_error", "ValidationError"),
        ("NanMetricWorkflow", "validation_error", "ValidationError"),
        ("WrongTypeWorkflow", "validation_error", "TypeError"),
        ("LeakyRuntimeErrorWorkflow", "agent_error", "RuntimeError"),
        ("ExitingWorkflow", "agent_error", "SystemExit"),
        ("NotAWorkflow", "validation_error", "LoadError"),
        ("Missing", "validation_error", "LoadError"),
    ],
)
def test_agent_failures_are_categorized(sandbox: Sandbox, workflow: str, category: str, type_: str) -> None:
    assert run_agent(workflow) == 1
    assert_error(sandbox, "agent", category=category, type_=type_)
    assert not sandbox.exists("agent/sample.json")


@pytest.mark.parametrize(
    "path",
    [
        f"{BUNDLE}.nope:Workflow",
        f"{BUNDLE}.broken:Workflow",
        f"{BUNDLE}.workflows.OutputWorkflow",
        f"{BUNDLE}.workflows:",
    ],
)
def test_agent_bad_import_paths(sandbox: Sandbox, path: str) -> None:
    assert agent.main(workflow=path, workflow_config=None, argv=[]) == 1
    assert_error(sandbox, "agent", category="validation_error", type_="LoadError")


def test_agent_bad_config_path(sandbox: Sandbox) -> None:
    assert run_agent("ListWorkflow", f"{BUNDLE}.workflows:no_such_config") == 1
    assert_error(sandbox, "agent", category="validation_error", type_="LoadError")


def test_agent_key_is_scrubbed_from_errors_and_logs(sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_agent("LeakyRuntimeErrorWorkflow") == 1
    error = assert_error(sandbox, "agent", category="agent_error", type_="RuntimeError")
    assert "upstream refused key ***" in error["message"]
    assert SECRET not in error["traceback"]
    assert SECRET not in capsys.readouterr().err
    # the fixture's teardown also scans every file under the sandbox


def test_agent_async_timeout(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_AGENT_TIMEOUT_SEC", "0.2")
    assert run_agent("SleepyWorkflow") == 1
    error = assert_error(sandbox, "agent", category="timeout", type_="TimeoutError")
    assert error["message"] == "workflow exceeded its 0.2s deadline"


def test_agent_timeout_is_recorded_before_stuck_threads_finish(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_AGENT_TIMEOUT_SEC", "0.2")
    started = time.time()
    assert run_agent("ThreadStuckWorkflow") == 1
    assert_error(sandbox, "agent", category="timeout", type_="TimeoutError")
    written = (sandbox.logs / "agent" / "error.json").stat().st_mtime
    assert written - started < 1.0  # not after the 1.5 s thread was joined


def test_agent_blocking_workflow_past_deadline_is_a_timeout(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_AGENT_TIMEOUT_SEC", "0.1")
    assert run_agent("BlockingWorkflow") == 1
    assert_error(sandbox, "agent", category="timeout", type_="TimeoutError")


def test_agent_generous_timeout_succeeds(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_AGENT_TIMEOUT_SEC", "30")
    assert run_agent("ListWorkflow") == 0


@pytest.mark.parametrize("value", ["soon", "nan", "inf"])
def test_agent_invalid_timeout_is_internal(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("OSMOSIS_AGENT_TIMEOUT_SEC", value)
    assert run_agent("ListWorkflow") == 1
    assert_error(sandbox, "agent", category="internal_error", type_="InputError")


def test_agent_missing_input_is_internal(sandbox: Sandbox) -> None:
    sandbox.rollout_input.unlink()
    assert run_agent("ListWorkflow") == 1
    assert_error(sandbox, "agent", category="internal_error", type_="InputError")


def test_agent_reads_an_inline_input_before_the_file(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    inline = [{"role": "user", "content": "sent inline"}]
    monkeypatch.setenv("OSMOSIS_ROLLOUT_INPUT_JSON", json.dumps({"rollout_id": "r-inline", "prompt": inline}))
    assert run_agent("ListWorkflow") == 0
    sample = sandbox.read("agent/sample.json")
    assert sample["messages"][0] == inline[0]  # not the staged file's prompt


def test_agent_inline_input_carrying_label_is_refused(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_ROLLOUT_INPUT_JSON", json.dumps({"rollout_id": "r-1", "prompt": PROMPT, "label": "4"}))
    assert run_agent("ListWorkflow") == 1
    error = assert_error(sandbox, "agent", category="internal_error", type_="InputError")
    assert "OSMOSIS_ROLLOUT_INPUT_JSON" in error["message"]


def test_agent_input_carrying_label_is_refused(sandbox: Sandbox) -> None:
    sandbox.rollout_input.write_text(json.dumps({"rollout_id": "r-1", "prompt": PROMPT, "label": "4"}))
    assert run_agent("ListWorkflow") == 1
    assert_error(sandbox, "agent", category="internal_error", type_="InputError")


# --------------------------------------------------------------------------
# verifier phase


def test_verifier_sets_reward_and_label(sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_agent("OutputWorkflow") == 0
    assert run_verifier("ExactGrader") == 0
    assert sandbox.read("verifier/reward.json") == {"reward": 1.0}
    graded = sandbox.read("verifier/sample.json")
    assert graded["reward"] == 1.0
    assert graded["label"] == "4"
    assert graded["metrics"] == {"steps": 1.0, "tokens": 7.0}
    assert RolloutSample.model_validate(graded).reward == 1.0
    assert not sandbox.exists("verifier/error.json")
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"osmosis-harbor-shim[verifier] v{SHIM_VERSION} ok rollout_id=r-1 reward=1.0")


def test_verifier_wrong_answer_gets_zero(sandbox: Sandbox) -> None:
    sandbox.stage(label="5")
    assert run_agent("OutputWorkflow") == 0
    assert run_verifier("ExactGrader") == 0
    assert sandbox.read("verifier/reward.json") == {"reward": 0.0}


def test_verifier_keeps_grader_edits(sandbox: Sandbox) -> None:
    sandbox.stage(metadata={"difficulty": "easy"})
    assert run_agent("OutputWorkflow") == 0
    assert run_verifier("EditingGrader", f"{BUNDLE}.graders:strict_config") == 0
    assert sandbox.read("verifier/reward.json") == {"reward": 0.75}
    graded = sandbox.read("verifier/sample.json")
    assert graded["metrics"] == {"steps": 1.0, "graded": 1}
    assert graded["extra_fields"] == {"judge": {"name": "strict", "meta": {"difficulty": "easy"}}}
    assert graded["remove_sample"] is False
    # the agent's own file is left untouched
    assert sandbox.read("agent/sample.json")["reward"] is None


def test_verifier_removed_sample_without_reward(sandbox: Sandbox) -> None:
    assert run_agent("SourceWorkflow") == 0
    assert run_verifier("RemovingGrader") == 0
    graded = sandbox.read("verifier/sample.json")
    assert graded["remove_sample"] is True
    assert graded["reward"] is None
    assert graded["trajectory_messages"] is None
    assert sandbox.read("verifier/reward.json") == {"reward": 0.0}


def test_verifier_grader_artifacts(sandbox: Sandbox) -> None:
    assert run_agent("ListWorkflow") == 0
    assert run_verifier("ArtifactGrader") == 0
    assert (sandbox.logs / "artifacts" / "grader.txt").read_text() == "4"


@pytest.mark.parametrize(
    ("grader", "category", "type_"),
    [
        ("NoRewardGrader", "validation_error", "ValueError"),
        ("RaisingGrader", "agent_error", "RuntimeError"),
        ("ValueErrorGrader", "validation_error", "ValueError"),
        ("NanGrader", "validation_error", "ValidationError"),
        ("Missing", "validation_error", "LoadError"),
    ],
)
def test_verifier_failures_write_no_reward(sandbox: Sandbox, grader: str, category: str, type_: str) -> None:
    assert run_agent("OutputWorkflow") == 0
    assert run_verifier(grader) == 1
    assert_error(sandbox, "verifier", category=category, type_=type_)
    assert not sandbox.exists("verifier/reward.json")
    assert not sandbox.exists("verifier/sample.json")


def test_verifier_not_a_grader(sandbox: Sandbox) -> None:
    assert run_agent("OutputWorkflow") == 0
    assert verifier.main(grader=f"{BUNDLE}.workflows:OutputWorkflow", grader_config=None, argv=[]) == 1
    assert_error(sandbox, "verifier", category="validation_error", type_="LoadError")


def test_verifier_timeout(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_agent("OutputWorkflow") == 0
    monkeypatch.setenv("OSMOSIS_GRADER_TIMEOUT_SEC", "0.2")
    assert run_verifier("SleepyGrader") == 1
    error = assert_error(sandbox, "verifier", category="timeout", type_="TimeoutError")
    assert error["message"] == "grader exceeded its 0.2s deadline"
    assert not sandbox.exists("verifier/reward.json")


def test_verifier_without_agent_sample(sandbox: Sandbox) -> None:
    assert run_agent("NothingWorkflow") == 1
    assert run_verifier("ExactGrader") == 1
    error = assert_error(sandbox, "verifier", category="validation_error", type_="AgentSampleError")
    assert "agent/error.json" in error["message"]
    assert not sandbox.exists("verifier/reward.json")


def test_verifier_invalid_agent_sample(sandbox: Sandbox) -> None:
    (sandbox.logs / "agent").mkdir(parents=True)
    (sandbox.logs / "agent" / "sample.json").write_text('{"messages": "not a list"')
    assert run_verifier("ExactGrader") == 1
    assert_error(sandbox, "verifier", category="validation_error", type_="AgentSampleError")


def test_verifier_missing_grading_input(sandbox: Sandbox) -> None:
    assert run_agent("OutputWorkflow") == 0
    sandbox.grading_input.unlink()
    assert run_verifier("ExactGrader") == 1
    assert_error(sandbox, "verifier", category="internal_error", type_="InputError")


def test_verifier_removes_stale_reward(sandbox: Sandbox) -> None:
    assert run_agent("OutputWorkflow") == 0
    assert run_verifier("ExactGrader") == 0
    assert run_verifier("RaisingGrader") == 1
    assert not sandbox.exists("verifier/reward.json")
    assert not sandbox.exists("verifier/sample.json")


# --------------------------------------------------------------------------
# standalone runs


def _subprocess_env(box: Sandbox, chat_url: str, pythonpath: list[Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env.update(box.env(chat_url))
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return env


def test_subprocess_via_osmosis_harbor_shim(sandbox: Sandbox, bundle_dir: Path, chat_server: FakeChatServer) -> None:
    code = (
        "import sys; from osmosis_harbor.shim import agent; "
        f"sys.exit(agent.main(workflow='{BUNDLE}.workflows:ChatWorkflow', workflow_config=None))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=_subprocess_env(sandbox, chat_url(chat_server), [bundle_dir]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "osmosis-harbor-shim[agent]" in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout
    assert sandbox.read("agent/sample.json")["messages"][-1]["content"] == "pong"


def test_subprocess_as_standalone_top_level_package(
    sandbox: Sandbox, bundle_dir: Path, chat_server: FakeChatServer, tmp_path: Path
) -> None:
    """The shim as bundle wheels ship it: ``osmosis_harbor_shim``, no Harbor."""
    site = tmp_path / "wheel-site"
    shutil.copytree(SHIM_SRC, site / "osmosis_harbor_shim", ignore=shutil.ignore_patterns("__pycache__"))
    code = textwrap.dedent(
        f"""
        import sys
        from osmosis_harbor_shim import agent, verifier
        rc = agent.main(workflow="{BUNDLE}.workflows:OutputWorkflow", workflow_config=None)
        rc = rc or verifier.main(grader="{BUNDLE}.graders:ExactGrader", grader_config=None)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("harbor", "osmosis_harbor"))
        print("LEAKED", leaked)
        sys.exit(rc or (3 if leaked else 0))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=_subprocess_env(sandbox, chat_url(chat_server), [site, bundle_dir]),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LEAKED []" in proc.stdout
    assert sandbox.read("verifier/reward.json") == {"reward": 1.0}


def test_shim_imports_only_stdlib_pydantic_osmosis_ai() -> None:
    allowed = set(sys.stdlib_module_names) | {"pydantic", "osmosis_ai"}
    for source in sorted(SHIM_SRC.glob("*.py")):
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            bad = [root for root in roots if root not in allowed]
            assert not bad, f"{source.name}:{node.lineno} imports {bad}"


def test_redactor_scrubs_escaped_spellings_and_ignores_placeholders() -> None:
    key = 'sk-"q/u o"te\\d-123'
    redactor = errors.Redactor.from_env({"OSMOSIS_API_KEY": key})
    text = f"a {key} b {json.dumps(key)} c {quote(key, safe='')}"
    assert redactor.text(text) == 'a *** b "***" c ***'
    data = redactor.data({key: [key, {"k": f"x{key}x"}, 1.5, None]})
    assert data == {"***": ["***", {"k": "x***x"}, 1.5, None]}
    assert errors.Redactor.from_env({"OSMOSIS_API_KEY": "EMPTY"}).secrets == ()
    assert errors.Redactor.from_env({}).text(key) == key
