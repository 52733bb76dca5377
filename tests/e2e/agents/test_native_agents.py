"""Harbor's native agents wired to a rollout's chat endpoint (``osmosis_harbor.agents.native``).

Config building (the endpoint wiring wins, the key is never in the config), the scoped
key variable, ATIF trajectory → ``RolloutSample``, and real trials through Harbor's
``TrialQueue`` in Docker sandboxes against the fake chat endpoint: terminus-2 completes a
task; mini-swe-agent cannot install here (it downloads a Python build from GitHub) and
the test proves that failure is reported clearly.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
import warnings
from pathlib import Path

import pytest
from harbor.agents.factory import AgentFactory
from harbor.models.trajectories import (
    Agent,
    ContentPart,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    SubagentTrajectoryRef,
    Trajectory,
)
from harbor.models.trial.config import TaskConfig, TrialConfig
from harbor.trial.queue import TrialQueue

from osmosis_harbor import settings
from osmosis_harbor.agents import native
from osmosis_harbor.agents.native import (
    NATIVE_AGENTS,
    NO_KEY_PLACEHOLDER,
    NativeAgentWiringWarning,
    NotTrainableWarning,
    TrajectoryError,
    native_agent_config,
    sample_from_trajectory,
    scoped_api_key,
)
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from osmosis_harbor.trials.contract_files import ContractBounds
from osmosis_harbor.trials.reading import TrialPhase, read_trial
from tests.support.common import make_task

URL = "http://127.0.0.1:8/v1"


def _secret() -> str:
    return f"sk-osmosis-{uuid.uuid4().hex}"


def _wiring_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, NativeAgentWiringWarning)]


# ── config building ────────────────────────────────────────────────────────────
def test_native_agents_are_the_three_registered_names() -> None:
    assert NATIVE_AGENTS == ("oracle", "terminus-2", "mini-swe-agent")
    with pytest.raises(ValueError, match="unknown native agent 'claude-code'"):
        native_agent_config("claude-code", chat_completions_url=URL)


@pytest.mark.parametrize("name", ["terminus-2", "mini-swe-agent"])
def test_trainable_agents_need_an_http_endpoint_and_a_key_variable_name(name: str) -> None:
    with pytest.raises(ValueError, match="chat_completions_url"):
        native_agent_config(name, chat_completions_url=None)
    with pytest.raises(ValueError, match="http"):
        native_agent_config(name, chat_completions_url="ftp://example/v1")
    with pytest.raises(ValueError, match="api_key_env"):
        native_agent_config(name, chat_completions_url=URL, api_key_env="not a name")


@pytest.mark.parametrize("name", ["terminus-2", "mini-swe-agent"])
def test_full_chat_completions_url_is_reduced_to_the_base_url(name: str) -> None:
    config = native_agent_config(name, chat_completions_url=URL + "/chat/completions/")
    assert config.base_url == URL


def test_terminus_wiring_wins_over_native_agent_kwargs() -> None:
    user = {
        "api_base": "http://evil.example/v1",
        "model_name": "openai/other",
        "api_key": "sk-user",
        "use_responses_api": True,
        "llm_backend": "tinker",
        "llm_kwargs": {"api_key": "sk-user", "api_base": "http://evil.example/v1", "timeout": 30},
        "llm_call_kwargs": {"base_url": "http://evil.example/v1", "extra_body": {"top_k": 5}},
        "max_turns": 7,
        "temperature": 0.3,
        "enable_summarize": True,  # a default, not wiring: the user may change it
    }
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = native_agent_config(
            "terminus-2",
            chat_completions_url=URL,
            api_key_env="ROLLOUT_KEY_1",
            model_name="openai/policy-7b",
            native_agent_kwargs=user,
            agent_timeout_sec=123,
            agent_setup_timeout_sec=45,
        )
    assert config.name == "terminus-2"
    assert config.base_url == URL
    assert config.model_name == "openai/policy-7b"
    assert config.model_api_key_name == "ROLLOUT_KEY_1"
    assert config.model_api_format == "openai_chat_completions"
    assert config.env == {}  # terminus-2 exports AgentConfig.env into the sandbox shell
    assert (config.override_timeout_sec, config.override_setup_timeout_sec) == (123, 45)
    assert config.kwargs == {
        "enable_summarize": True,
        "trajectory_config": {"raw_content": True},
        "record_terminal_session": False,
        "llm_kwargs": {"timeout": 30},
        "llm_call_kwargs": {"extra_body": {"top_k": 5}},
        "max_turns": 7,
        "temperature": 0.3,
    }
    messages = _wiring_warnings(record)
    for key in (
        "api_base",
        "model_name",
        "api_key",
        "use_responses_api",
        "llm_backend",
        "llm_kwargs.api_key",
        "llm_kwargs.api_base",
        "llm_call_kwargs.base_url",
    ):
        assert any(f"native_agent_kwargs[{key!r}] for terminus-2 ignored" in m for m in messages), key
    assert len(messages) == 8
    assert user["llm_kwargs"]["api_key"] == "sk-user"  # the caller's dict is not mutated
    assert all(w.filename == __file__ for w in record)  # attributed to the caller


def test_mini_swe_agent_wiring_wins_over_its_native_config(tmp_path: Path) -> None:
    config_file = tmp_path / "mini.yaml"
    config_file.write_text(
        "agent:\n  step_limit: 4\n"
        "model:\n  model_name: anthropic/claude\n  model_class: portkey\n"
        "  model_kwargs:\n    api_key: sk-user\n    api_base: http://evil.example\n    temperature: 0.0\n"
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = native_agent_config(
            "mini-swe-agent",
            chat_completions_url=URL,
            api_key_env="ROLLOUT_KEY_2",
            native_agent_kwargs={"config_file": str(config_file), "base_url": "http://evil.example", "max_tokens": 256},
        )
    assert config.base_url == URL and config.model_name == "openai/osmosis-rollout"
    assert config.model_api_key_name is None  # would copy the key into mini's saved config
    assert config.env == {"OPENAI_API_KEY": "${ROLLOUT_KEY_2}"}
    assert config.kwargs == {
        "max_tokens": 256,
        "config": {"agent": {"step_limit": 4}, "model": {"model_kwargs": {"temperature": 0.0}}},
    }
    messages = _wiring_warnings(record)
    assert len(messages) == 5, messages
    for key in (
        "base_url",
        "config.model.model_name",
        "config.model.model_class",
        "config.model.model_kwargs.api_key",
        "config.model.model_kwargs.api_base",
    ):
        assert any(f"[{key!r}] for mini-swe-agent" in m for m in messages), key


def test_oracle_needs_no_endpoint_and_warns_once_that_it_is_not_trainable(monkeypatch) -> None:
    monkeypatch.setattr(native, "_ORACLE_WARNED", False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = native_agent_config("oracle", chat_completions_url=None, agent_timeout_sec=60)
        second = native_agent_config("oracle")
    assert first.name == second.name == "oracle"
    assert first.base_url is None and first.model_api_key_name is None and first.override_timeout_sec == 60
    oracle = [str(w.message) for w in record if issubclass(w.category, NotTrainableWarning)]
    assert len(oracle) == 1 and "not trainable" in oracle[0]


def test_scoped_api_key_is_unique_per_rollout_and_removed_afterwards() -> None:
    with scoped_api_key("sk-a") as a, scoped_api_key("sk-b") as b, scoped_api_key(None) as keyless:
        assert a != b and a.startswith("OSMOSIS_API_KEY_")
        assert (os.environ[a], os.environ[b], os.environ[keyless]) == ("sk-a", "sk-b", NO_KEY_PLACEHOLDER)
    assert not {a, b, keyless} & set(os.environ)
    with pytest.raises(RuntimeError), scoped_api_key("sk-c") as c:
        raise RuntimeError("trial crashed")
    assert c not in os.environ


@pytest.mark.parametrize("name", ["terminus-2", "mini-swe-agent"])
def test_key_reaches_the_agent_but_never_the_config(name: str, tmp_path: Path) -> None:
    secret = _secret()
    with scoped_api_key(secret) as key_env:
        config = native_agent_config(
            name,
            chat_completions_url=URL,
            api_key_env=key_env,
            native_agent_kwargs={"temperature": 0.5} if name == "terminus-2" else None,
        )
        trial = TrialConfig(task=TaskConfig(path=tmp_path), trials_dir=tmp_path, agent=config)
        for dumped in (
            config.model_dump_json(),
            trial.model_dump_json(),
            config.model_dump_json(exclude_defaults=True),
        ):
            assert secret not in dumped and key_env in dumped
        # Harbor's own checks accept the config, and the agent it builds has the key.
        AgentFactory.run_preflight(config)
        agent = AgentFactory.create_agent_from_config(config, logs_dir=tmp_path)
        connection = agent.model_connection
        assert connection.api_key == secret and connection.execution_base_url == URL
        if name == "terminus-2":
            # LiteLLM runs on the host with the key in memory; nothing goes to the sandbox.
            assert agent._llm._llm_kwargs["api_key"] == secret and agent._llm._api_base == URL
            assert agent.extra_env == {}
        else:
            # Only the agent's exec environment carries it into the sandbox.
            assert connection.env["OPENAI_API_KEY"] == secret
            assert connection.env["OPENAI_BASE_URL"] == URL
    assert key_env not in os.environ


@pytest.mark.parametrize(
    ("name", "error"),
    [("terminus-2", "selected by --api-key-name is not set"), ("mini-swe-agent", "not found in host environment")],
)
def test_a_missing_rollout_key_fails_closed_instead_of_using_the_hosts_key(
    name: str, error: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-own-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    config = native_agent_config(name, chat_completions_url=URL, api_key_env="OSMOSIS_API_KEY_GONE")
    with pytest.raises(ValueError, match=f"OSMOSIS_API_KEY_GONE.*{error}|{error}.*OSMOSIS_API_KEY_GONE"):
        AgentFactory.create_agent_from_config(config, logs_dir=tmp_path).model_connection  # noqa: B018


# ── ATIF trajectory → RolloutSample ───────────────────────────────────────────
def _write_trajectory(trial_dir: Path, document: dict) -> None:
    (trial_dir / "agent").mkdir(parents=True, exist_ok=True)
    (trial_dir / "agent" / "trajectory.json").write_text(json.dumps(document))


def test_no_trajectory_means_no_sample(tmp_path: Path) -> None:
    assert sample_from_trajectory(tmp_path, ContractBounds.of(settings.current())) is None  # oracle leaves none
    _write_trajectory(tmp_path, {"schema_version": "ATIF-v1.7"})
    with pytest.raises(TrajectoryError, match="no 'steps' list"):
        sample_from_trajectory(tmp_path, ContractBounds.of(settings.current()))
    (tmp_path / "agent" / "trajectory.json").write_text("{not json")
    with pytest.raises(TrajectoryError, match="not a readable JSON"):
        sample_from_trajectory(tmp_path, ContractBounds.of(settings.current()))


def _mini_swe_agent_native_trajectory() -> dict:
    """What mini-swe-agent 2.x saves (tool-calling LiteLLM model), for Harbor to convert."""

    def usage(p: int, c: int) -> dict:
        return {"prompt_tokens": p, "completion_tokens": c, "prompt_tokens_details": {"cached_tokens": 0}}

    return {
        "trajectory_format": "mini-swe-agent-1.1",
        "info": {
            "mini_version": "2.4.6",
            "exit_status": "Submitted",
            "submission": "",
            "model_stats": {"instance_cost": 0.0, "api_calls": 2},
            "config": {"model": {"model_name": "openai/osmosis-rollout"}, "agent": {"step_limit": 0}},
        },
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
            {"role": "user", "content": "Please solve this issue: write hello to /tmp/done"},
            {
                "role": "assistant",
                "content": "I will write the file.",
                "tool_calls": [
                    {
                        "id": "call_a1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "echo hello > /tmp/done"}'},
                    }
                ],
                "extra": {"response": {"usage": usage(120, 20)}, "timestamp": 1760000000.0},
            },
            {
                "role": "tool",
                "tool_call_id": "call_a1",
                "content": '{\n  "returncode": 0,\n  "output": ""\n}',
                "extra": {"raw_output": "", "returncode": 0, "timestamp": 1760000001.0},
            },
            {
                "role": "assistant",
                "content": "Done; submitting.",
                "tool_calls": [
                    {
                        "id": "call_a2",
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": '{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}',
                        },
                    }
                ],
                "extra": {"response": {"usage": usage(160, 12)}, "timestamp": 1760000002.0},
            },
            {"role": "exit", "content": "", "extra": {"exit_status": "Submitted", "submission": ""}},
        ],
    }


def test_mini_swe_agent_trajectory_becomes_an_openai_chat_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Harbor's mini-swe-agent module imports litellm; imported directly (not through one of our
    # entry points, which set this themselves: tests/e2e/cli/test_model_prices.py) it would download
    # litellm's price map. Tests talk to 127.0.0.1 only.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "True"))
    from harbor.agents.installed.mini_swe_agent import convert_mini_swe_agent_to_atif

    document = convert_mini_swe_agent_to_atif(_mini_swe_agent_native_trajectory(), "trial__agent")
    _write_trajectory(tmp_path, document.to_json_dict())
    sample = sample_from_trajectory(tmp_path, ContractBounds.of(settings.current()))
    assert sample is not None
    assert [m["role"] for m in sample.messages] == ["system", "user", "assistant", "tool", "assistant"]
    first = sample.messages[2]
    assert first["content"] == "I will write the file."
    assert first["tool_calls"] == [
        {
            "id": "call_a1",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": "echo hello > /tmp/done"})},
        }
    ]
    # Harbor's converter drops the result's call id; the single result answers the single call.
    assert sample.messages[3] == {
        "role": "tool",
        "tool_call_id": "call_a1",
        "content": '{\n  "returncode": 0,\n  "output": ""\n}',
    }
    assert sample.metrics == {"prompt_tokens": 280, "completion_tokens": 32, "llm_calls": 2}
    assert sample.extra_fields["agent"] == {
        "name": "mini-swe-agent",
        "version": "2.4.6",
        "model_name": "openai/osmosis-rollout",
    }
    assert sample.extra_fields["session_id"] == "trial__agent"
    assert sample.trajectory_messages == sample.messages
    assert sample.reward is None and sample.label is None  # the caller's to fill in


def test_atif_details_map_to_chat_messages(tmp_path: Path) -> None:
    """Content parts, reasoning, call-linked and free observations, summarization markers,
    copied context and token ids, from a document built with Harbor's own ATIF models."""
    trajectory = Trajectory(
        session_id="s-1",
        agent=Agent(name="terminus-2", version="2.0.0", model_name="openai/osmosis-rollout"),
        steps=[
            Step(
                step_id=1,
                source="user",
                message=[ContentPart(type="text", text="Task:"), ContentPart(type="text", text="make /tmp/done")],
            ),
            Step(
                step_id=2,
                source="agent",
                message='{"commands": []}',
                reasoning_content="thinking",
                observation=Observation(results=[ObservationResult(content="$ ")]),
                metrics=Metrics(
                    prompt_tokens=10,
                    completion_tokens=3,
                    prompt_token_ids=[1, 2],
                    completion_token_ids=[7, 8, 9],
                    logprobs=[-0.1, -0.2, -0.3],
                ),
            ),
            Step(
                step_id=3,
                source="system",
                message="Performed context summarization and handoff.",
                observation=Observation(
                    results=[
                        ObservationResult(
                            subagent_trajectory_ref=[
                                SubagentTrajectoryRef(
                                    session_id="s-1-summary", trajectory_path="trajectory.summarization-1-summary.json"
                                )
                            ]
                        )
                    ]
                ),
            ),
            Step(step_id=4, source="user", message="earlier turn", is_copied_context=True),
            Step(
                step_id=5,
                source="agent",
                message="run it",
                tool_calls=[
                    {"tool_call_id": "c1", "function_name": "bash_command", "arguments": {"keystrokes": "ls\n"}},
                    {"tool_call_id": "c2", "function_name": "mark_task_complete", "arguments": {}},
                ],
                observation=Observation(
                    results=[
                        ObservationResult(source_call_id="c1", content="a b"),
                        ObservationResult(content="Are you sure?"),
                        ObservationResult(content="second note"),
                    ]
                ),
            ),
        ],
        final_metrics=FinalMetrics(total_prompt_tokens=25, total_completion_tokens=9, total_cached_tokens=0),
    )
    _write_trajectory(tmp_path, trajectory.to_json_dict())
    sample = sample_from_trajectory(tmp_path, ContractBounds.of(settings.current()))
    assert sample is not None
    assert sample.messages == [
        {"role": "user", "content": "Task:\nmake /tmp/done"},
        {"role": "assistant", "content": '{"commands": []}', "reasoning_content": "thinking"},
        {"role": "user", "content": "$ "},
        {
            "role": "assistant",
            "content": "run it",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash_command", "arguments": json.dumps({"keystrokes": "ls\n"})},
                },
                {"id": "c2", "type": "function", "function": {"name": "mark_task_complete", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a b"},
        {"role": "user", "content": "Are you sure?"},  # two loose results, one open call: not paired
        {"role": "user", "content": "second note"},
    ]
    assert sample.metrics == {"prompt_tokens": 25, "completion_tokens": 9, "cached_tokens": 0, "llm_calls": 2}
    assert sample.extra_fields["context_compactions"] == 1
    assert sample.extra_fields["completion_token_ids"] == [[7, 8, 9], None]
    assert sample.extra_fields["logprobs"] == [[-0.1, -0.2, -0.3], None]


# ── real trials through TrialQueue in Docker sandboxes ─────────────────────────
TERMINUS_IMAGE = (
    "FROM debian:trixie-slim\n"
    # Baked in to keep the test fast; without it terminus-2 installs tmux with apt itself.
    "RUN apt-get update && apt-get install -y --no-install-recommends tmux && rm -rf /var/lib/apt/lists/*\n"
)
MINI_IMAGE = (
    "FROM python:3.12-slim\n"
    # Everything mini-swe-agent's installer can get offline here (Debian mirror, PyPI).
    "RUN apt-get update && apt-get install -y --no-install-recommends curl git gcc make "
    "&& rm -rf /var/lib/apt/lists/* && pip install --no-cache-dir uv\n"
)
CHECK_HELLO = (
    "if grep -qx hello /tmp/done 2>/dev/null; then echo 1 > /logs/verifier/reward.txt; "
    "else echo 0 > /logs/verifier/reward.txt; fi\n"
)


def _files_containing(root: Path, needle: str) -> list[str]:
    data = needle.encode()
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and data in p.read_bytes()]


async def _run_trial(task: Path, agent, trials_dir: Path, queue: TrialQueue | None = None):
    config = TrialConfig(
        task=TaskConfig(path=task),
        trial_name=f"{task.name}__{uuid.uuid4().hex[:8]}",
        trials_dir=trials_dir,
        agent=agent,
        environment=environment_config("docker", host_network=True),
    )
    owner = SandboxOwner.make("test", config=settings.current())  # the trial's sandboxes: swept once it is done
    try:
        with owner_scope(owner):
            result = await (queue or TrialQueue(n_concurrent=1)).submit(config)
    finally:
        await owner.close()
    return result, trials_dir / config.trial_name


@pytest.fixture
def no_harbor_scrub(monkeypatch):
    """Harbor scrubs known secrets from the trial dir when a trial ends; switch that off so
    "the key is in no file" proves the key was never written, not that it was cleaned up."""
    from harbor.trial.trial import Trial

    monkeypatch.setattr(Trial, "_scrub_jobs_dir", lambda self: None)


@pytest.fixture
def fake_chat():
    servers: list[FakeChatServer] = []

    def start(reply: str) -> FakeChatServer:
        servers.append(FakeChatServer(default_reply=reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


TERMINUS_REPLY = json.dumps(
    {
        "analysis": "The file does not exist yet.",
        "plan": "Write hello into /tmp/done, then finish.",
        "commands": [{"keystrokes": "echo hello > /tmp/done\n", "duration": 0.1}],
        "task_complete": True,
    }
)


@pytest.mark.slow
async def test_terminus_2_completes_tasks_each_rollout_with_its_own_endpoint_and_key(
    tmp_path: Path, fake_chat, docker_sandbox_sdk, no_harbor_scrub
) -> None:
    """Two terminus-2 rollouts at once, each with its own endpoint and scoped key variable: one
    on an image with tmux baked in (the default model name; what the policy is sent and the
    sample, read in full), one on a plain image, where terminus-2 installs tmux itself (apt,
    from the Debian mirror), under a model name of its own."""
    tasks = [
        make_task(tmp_path / "tasks", "native-terminus", dockerfile=TERMINUS_IMAGE, test=CHECK_HELLO),
        make_task(tmp_path / "tasks", "native-plain", dockerfile="FROM debian:trixie-slim\n", test=CHECK_HELLO),
    ]
    for task in tasks:
        (task / "instruction.md").write_text("Write the single word hello into /tmp/done.\n")
    queue = TrialQueue(n_concurrent=2)

    async def rollout(task: Path, model_name: str | None):
        server, secret = fake_chat(TERMINUS_REPLY), _secret()
        with scoped_api_key(secret) as key_env:
            agent = native_agent_config(
                "terminus-2",
                chat_completions_url=server.base_url,
                api_key_env=key_env,
                **({"model_name": model_name} if model_name else {}),
                agent_timeout_sec=90,
                agent_setup_timeout_sec=240,
            )
            result, trial_dir = await _run_trial(task, agent, tmp_path / "trials", queue)
        return server, secret, key_env, result, trial_dir

    started = time.monotonic()
    runs = await asyncio.gather(rollout(tasks[0], None), rollout(tasks[1], "openai/policy-1"))
    print(f"2 concurrent terminus-2 trials (one installing tmux): {time.monotonic() - started:.1f}s")
    secrets = {secret for _, secret, _, _, _ in runs}
    models = ["osmosis-rollout", "policy-1"]  # LiteLLM drops the "openai/" route
    for (server, secret, key_env, result, trial_dir), model in zip(runs, models, strict=True):
        reading = read_trial(result, trial_dir, ContractBounds.of(settings.current()))
        assert reading.failed_phase is None and reading.reward == 1.0, reading
        # Two calls: the command batch, then the confirmation Terminus asks for.
        assert len(server.requests) == 2
        for request in server.requests:
            assert request.path == "/v1/chat/completions"
            assert request.authorization == f"Bearer {secret}"
            assert request.body["model"] == model
        for any_secret in secrets:
            assert _files_containing(trial_dir, any_secret) == []
        assert key_env in (trial_dir / "config.json").read_text() and key_env not in os.environ

    server, _, _, _, trial_dir = runs[0]
    sample = sample_from_trajectory(trial_dir, ContractBounds.of(settings.current()))
    assert sample is not None
    roles = [m["role"] for m in sample.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert "Write the single word hello into /tmp/done." in sample.messages[0]["content"]
    assert sample.messages[1]["content"] == TERMINUS_REPLY == sample.messages[3]["content"]  # verbatim replies
    # What the policy was sent is what the sample holds (the last user turn was never sent).
    sent = server.requests[-1].body["messages"]
    assert [{"role": m["role"], "content": m["content"]} for m in sent] == sample.messages[:3]
    assert sample.metrics["llm_calls"] == 2 and sample.metrics["prompt_tokens"] == 2
    assert sample.extra_fields["agent"]["name"] == "terminus-2"


@pytest.mark.slow
async def test_mini_swe_agent_install_failure_offline_is_reported_clearly(
    tmp_path: Path, fake_chat, docker_sandbox_sdk, no_harbor_scrub
) -> None:
    """mini-swe-agent's installer runs ``uv python install 3.12``, which downloads a
    python-build-standalone release from github.com: unreachable from sandboxes here. Which of
    uv's two refusals the log shows depends on the uv release baked into the stand-in image: the
    download failing, or the image's ``UV_PYTHON_DOWNLOADS=never`` refusing it first."""
    server = fake_chat("unused")
    task = make_task(tmp_path / "tasks", "native-mini", dockerfile=MINI_IMAGE, test=CHECK_HELLO)
    secret = _secret()
    started = time.monotonic()
    with scoped_api_key(secret) as key_env:
        agent = native_agent_config(
            "mini-swe-agent",
            chat_completions_url=server.base_url,
            api_key_env=key_env,
            agent_timeout_sec=60,
            agent_setup_timeout_sec=120,
        )
        result, trial_dir = await _run_trial(task, agent, tmp_path / "trials")
    print(f"mini-swe-agent trial: {time.monotonic() - started:.1f}s")

    reading = read_trial(result, trial_dir, ContractBounds.of(settings.current()))
    assert reading.failed_phase is TrialPhase.AGENT_SETUP, reading
    assert result.agent_execution is None  # it never ran
    exc = result.exception_info
    assert exc is not None and exc.exception_type == "NonZeroAgentExitCodeError"
    assert "uv python install 3.12" in exc.exception_message
    assert (
        "github.com/astral-sh/python-build-standalone" in exc.exception_message
        or 'python-downloads = "never"' in exc.exception_message
    ), exc.exception_message
    assert server.requests == [] and reading.reward is None
    assert sample_from_trajectory(trial_dir, ContractBounds.of(settings.current())) is None
    assert _files_containing(trial_dir, secret) == []
