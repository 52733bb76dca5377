"""The README and docs/, run as written: every fenced ``bash`` and ``python`` block is extracted
from README.md and docs/*.md themselves (so the two cannot drift) and exercised, with its
documented result checked.

``test_every_block_is_exercised`` fails when a block is added, removed or moved to another
section or file without a runner here: a new example needs a test before it lands. A block whose
flow another module drives anyway is run as written there (its runner here is ``None``): the
``osmosis eval run`` walk-through by ``test_eval_harness.py``, the ``Shutdown`` continuation with
the ``HarborBackend`` example."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.tasks.discovery import discover_tasks
from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import REPO, TASKS, wait_until
from tests.support.readme_blocks import DOCS, Block, block, readme_blocks

pytestmark = pytest.mark.slow


def sh(command: str, *, timeout: float = 900, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"HOME": str(home)} if home else {})}
    return subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


# ── the runners, one per block ────────────────────────────────────────────────


def run_two_commands(b: Block, tmp_path: Path) -> None:
    validate, suite = b.commands()
    # Command 2 is the CI entry point itself (running it here would run this suite again).
    ci_lines = [line.removeprefix("exec ").strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert suite in ci_lines, "CI must run README command 2 as written"
    proc = sh(validate)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the Docker leg of test_validate.py's bundled-dataset test: every task, each a row of the table
    ids = {t.id for t in discover_tasks(TASKS)}
    assert len(ids) >= 6 and f"{len(ids)} passed, 0 failed" in proc.stdout
    rows = proc.stdout.splitlines()
    for task_id in ids:
        assert any(task_id in row and "pass" in row.lower() for row in rows), (task_id, proc.stdout[-3000:])
    assert "files/workdir-task" in proc.stdout


def run_base_images(b: Block, tmp_path: Path) -> None:
    build, listing = b.commands()
    assert sh(build).returncode == 0
    proc = sh(listing)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("ubuntu:24.04"))
    assert "debian/trixie" in row and "present" in row


def run_validate_synopsis(b: Block, tmp_path: Path) -> None:
    """A synopsis, not a command: every option it shows is a real option with those choices."""
    (synopsis,) = b.commands()
    help_text = sh(".venv/bin/python -m osmosis_harbor validate --help").stdout
    for option in set(re.findall(r"--[a-z][a-z-]*", synopsis)):
        assert option in help_text, f"README shows validate {option}, which --help does not know"
    assert "oracle" in help_text and "nop" in help_text and "skypilot" in help_text


def run_sandbox_layer(b: Block, tmp_path: Path) -> None:
    """Line by line: the SkyPilot line needs SkyPilot's Sandbox SDK, and where it is missing
    (as here) the documented result is the one-line install hint, raised at once."""
    import importlib.util

    from osmosis_harbor.sandbox import SandboxSdkMissingError

    lines = [line.split("  #")[0].strip() for line in b.body.splitlines() if line.strip()]
    namespace: dict = {}
    exec(lines[0], namespace)  # the import
    production, local, reach = lines[1:]
    if importlib.util.find_spec("sky") is not None and importlib.util.find_spec("sky.sandbox") is not None:
        config = eval(production, namespace)
        assert config.kwargs["sdk"] == "skypilot" and config.kwargs["registry"] == "registry.example.com/team"
    else:
        with pytest.raises(SandboxSdkMissingError, match="Platform Sandbox SDK"):
            eval(production, namespace)
    assert eval(local, namespace).kwargs["sdk"] == "docker" and not eval(local, namespace).kwargs.get("host_network")
    assert eval(reach, namespace).kwargs["host_network"] is True


def run_server_example(backend_block: Block, shutdown_block: Block, tmp_path: Path) -> None:
    """The HarborBackend example and its Shutdown continuation, as one script: it prewarms the
    graded calc template, serves on port 8000, grades a rollout, then drains on SIGTERM."""
    script = tmp_path / "readme_server.py"
    script.write_text(backend_block.body + "\n" + shutdown_block.body)
    home = tmp_path / "home"
    home.mkdir()
    server = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO,
        env={**os.environ, "HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    chat = FakeChatServer(default_reply="(17 + 4) * 2")
    try:

        def healthy() -> bool:
            assert server.poll() is None, server.stdout.read()
            try:
                with urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_until(healthy, timeout=300, what="the README server to prewarm and listen")
        rollout_id = f"readme-{uuid.uuid4().hex[:8]}"

        async def roll():
            from osmosis_ai.rollout.client import RolloutClient

            client = RolloutClient(url="http://127.0.0.1:8000")
            try:
                return await client.run_rollout(
                    initial_messages=[{"role": "user", "content": "What is (17 + 4) * 2?"}],
                    chat_completions_url=chat.base_url,
                    rollout_id=rollout_id,
                    llm_api_key="sk-readme",
                    label="42",
                )
            finally:
                await client.aclose()

        result = asyncio.run(roll())
        assert str(result.status) in ("success", "RolloutStatus.SUCCESS"), result.err_message
        assert result.sample.reward == 1.0
        with urllib.request.urlopen(f"http://127.0.0.1:8000/rollout/{rollout_id}/status", timeout=5) as response:
            assert json.loads(response.read())["status"] == "success"
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0, server.stdout.read()
    finally:
        chat.close()
        if server.poll() is None:
            server.kill()
            server.wait()


def run_one_rollout(b: Block, tmp_path: Path) -> None:
    """The result panel holds the whole rollout: the graded verdict, the metrics, and the
    conversation, in which the sandbox really ran the policy's command (the calc example end to end)."""
    (command,) = b.commands()
    proc = sh(command, home=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    body = [line.strip().strip("│").strip() for line in proc.stdout.splitlines()]
    assert "status: success" in body and "reward: 1.0" in body, proc.stdout
    (start,) = [i for i, line in enumerate(body) if line.startswith("metrics: ")]
    end = next(i for i in range(start, len(body)) if body[i].endswith("}"))
    metrics = " ".join(body[start : end + 1])  # the panel wraps a long dict at its spaces
    assert "'llm_calls': 1.0" in metrics, metrics
    roles = [m[1] for line in body if (m := re.match(r"\[(system|user|assistant|tool)\] ", line))]
    assert roles == ["system", "user", "assistant", "user"], proc.stdout
    assert "[user] What is (17 + 4) * 2?" in body and "[assistant] (17 + 4) * 2" in body
    answer = body.index("42")  # the sandbox ran it: the command, its output, its exit code
    assert body[answer - 1].startswith("[user] $ ") and body[answer + 1] == "[exit code 0]", proc.stdout


def run_prewarm(b: Block, tmp_path: Path) -> None:
    (command,) = b.commands()
    report = REPO / "prewarm.json"
    try:
        proc = sh(command)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        data = json.loads(report.read_text())
        assert data["failed"] == 0 and data["tasks"] == len({p.parent for p in TASKS.rglob("task.toml")})
        for group in data["groups_detail"]:
            assert group["pool"].startswith("warm-") and group["pool_size"] == 2 and group["setup_ok"]
            assert docker_sdk.get_pool(group["pool"]).replicas == 2
    finally:
        report.unlink(missing_ok=True)
        cleanup = sh(".venv/bin/python -m osmosis_harbor cleanup --pool warm")  # as the README says
    assert cleanup.returncode == 0
    assert not [p for p in docker_sdk.list_pools() if p.name.startswith("warm-")]


def run_bundle(b: Block, tmp_path: Path) -> None:
    (command,) = b.commands()
    proc = sh(command)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert Path(info["wheel"]).is_file() and info["wheel"].endswith(".whl")
    assert (info["agent_script"], info["grade_script"]) == ("calc-agent-agent", "calc-agent-grade")


RUNNERS: dict[tuple[str, str], Callable[[Path], None]] = {
    ("Two commands", "bash"): lambda t: run_two_commands(block("Two commands", "bash"), t),
    ("Offline base images", "bash"): lambda t: run_base_images(block("Offline base images", "bash"), t),
    ("Oracle validation of a dataset", "bash"): lambda t: run_validate_synopsis(
        block("Oracle validation of a dataset", "bash"), t
    ),
    ("The SkyPilot path", "python"): lambda t: run_sandbox_layer(block("The SkyPilot path", "python"), t),
    ("Rollouts: `HarborBackend`", "python"): lambda t: run_server_example(
        block("Rollouts: `HarborBackend`", "python"), block("Shutdown", "python"), t
    ),
    ("Shutdown", "python"): None,  # runs as the continuation of the HarborBackend example
    ("One rollout locally, in one command", "bash"): lambda t: run_one_rollout(
        block("One rollout locally, in one command", "bash"), t
    ),
    ("Prewarm, warm pools, admission, status and cancel", "bash"): lambda t: run_prewarm(
        block("Prewarm, warm pools, admission, status and cancel", "bash"), t
    ),
    ("Bundles", "bash"): lambda t: run_bundle(block("Bundles", "bash"), t),
    # run as written by test_eval_harness.py, whose assertions (the LocalBackend control, the
    # resume, the untouched source) read that same run: one harness run, not two
    ("Evaluating with `osmosis eval run`", "bash"): None,
}

# Runnable blocks of docs/*.md, keyed by (file, section, language); their reference pages hold
# none today (commands there are inline, and examples are ``text``).
DOC_RUNNERS: dict[tuple[str, str, str], Callable[[Path], None]] = {}


def test_every_block_is_exercised() -> None:
    assert (DOCS / "architecture.md").is_file(), "docs/ is where the README's reference moved"
    blocks = readme_blocks()
    in_docs = sorted({(b.doc, b.section, b.lang) for b in blocks if b.doc != "README.md"})
    assert in_docs == sorted(DOC_RUNNERS), "docs/ blocks and their runners differ: add a runner for a new block"
    found = sorted({(b.section, b.lang) for b in blocks if b.doc == "README.md"})
    assert found == sorted(RUNNERS), "README blocks and their runners differ: add a runner for a new block"


@pytest.mark.parametrize(
    "key",
    [k for k, runner in RUNNERS.items() if runner is not None] + list(DOC_RUNNERS),
    ids=lambda k: ":".join(k),
)
def test_readme_block_runs_as_written(key: tuple[str, ...], tmp_path: Path) -> None:
    runner = RUNNERS[key] if len(key) == 2 else DOC_RUNNERS[key]  # type: ignore[index]
    assert runner is not None
    runner(tmp_path)
