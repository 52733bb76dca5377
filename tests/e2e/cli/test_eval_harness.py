"""``osmosis eval run`` (osmosis-ai's local evaluation harness) driving the example workspace,
as a new user runs it: a workspace made by ``scripts/eval-workspace.sh``, the harness's own
``uv sync`` of the rollout project, its rollout server (``main.py``: HarborBackend on docker or
skypilot-emulator), its model bridge reaching a scripted policy through litellm's
``OPENAI_BASE_URL``, and the same evaluation under osmosis-ai's LocalBackend as the control:
the same rewards row for row (five right, one wrong on purpose), the same artifacts, a run that
resumes by name, and a workspace whose source the run left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from osmosis_ai.source_scan import source_digest

from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import REPO
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.slow]

BIN = Path(sys.executable).parent  # osmosis and uv come with osmosis-ai[eval] (the dev extras)
EXAMPLE = REPO / "examples" / "eval_workspace"
HARNESS_TIMEOUT_SEC = 600


@dataclass(frozen=True)
class EvalRun:
    run_dir: Path
    rewards: dict[int, float | None]  # row -> reward
    artifacts: dict[str, dict[str, bytes]]  # row_<i>_run_0 -> relative path -> bytes
    output: str


def make_workspace(dest: Path, sandboxes: str) -> Path:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "eval-workspace.sh"), str(dest)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    config = dest / "configs" / "eval" / "calc.toml"
    config.write_text(config.read_text().replace('CALC_SANDBOXES = "docker"', f'CALC_SANDBOXES = "{sandboxes}"'))
    return dest


def harness_env(policy: FakeChatServer, tmp: Path) -> dict[str, str]:
    tmp.mkdir(exist_ok=True)
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "OPENAI_BASE_URL": policy.base_url,  # litellm's openai provider, as a user points it at a local model
        "OPENAI_API_KEY": "sk-harness-test-key",
        "UV_PYTHON": sys._base_executable,  # the harness's uv needs a Python >= 3.12, offline
        "UV_PYTHON_DOWNLOADS": "never",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the harness's own litellm: no download of prices
        "TMPDIR": str(tmp),
        "COLUMNS": "200",
    }


def eval_run(workspace: Path, env: dict[str, str], config: str, name: str) -> EvalRun:
    argv = [str(BIN / "osmosis"), "eval", "run", f"configs/eval/{config}.toml"]
    argv += ["--dataset-file", "data/calc.jsonl", "-y", "--name", name]
    done = subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=HARNESS_TIMEOUT_SEC)
    run_dir = workspace / ".osmosis" / "evals" / name
    logs = (run_dir / "logs.txt").read_text() if (run_dir / "logs.txt").is_file() else ""
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{logs[-6000:]}"
    rows = [json.loads(line) for line in (run_dir / "summary.jsonl").read_text().splitlines() if line.strip()]
    artifacts = {
        item.name: {p.relative_to(item).as_posix(): p.read_bytes() for p in sorted(item.rglob("*")) if p.is_file()}
        for item in sorted((run_dir / "artifacts").iterdir())
    }
    return EvalRun(run_dir, {r["row_index"]: r.get("reward") for r in rows}, artifacts, done.stdout + done.stderr)


@pytest.fixture(scope="module")
def policy() -> FakeChatServer:
    replies = json.loads((EXAMPLE / "data" / "calc.replies.json").read_text())
    server = FakeChatServer(default_reply="echo 42", replies=replies)
    yield server
    server.close()


@pytest.fixture(scope="module")
def local_control(policy: FakeChatServer, tmp_path_factory: pytest.TempPathFactory) -> EvalRun:
    """The same evaluation under osmosis-ai's LocalBackend (``configs/eval/calc-local.toml``)."""
    root = tmp_path_factory.mktemp("local")
    workspace = make_workspace(root / "workspace", "docker")
    return eval_run(workspace, harness_env(policy, root / "tmp"), "calc-local", "control")


@DOCKER_PATH_ONLY
def test_osmosis_eval_run_drives_the_example_workspace(
    tmp_path: Path, policy: FakeChatServer, local_control: EvalRun, sandbox_sdk: SdkPath
) -> None:
    workspace = make_workspace(tmp_path / "workspace", sandbox_sdk.name)
    rollout = workspace / "rollouts" / "calc"
    before = source_digest(rollout)
    env = harness_env(policy, tmp_path / "tmp")

    run = eval_run(workspace, env, "calc", "harbor")
    assert run.rewards == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 0.0}  # 9 + 12 is scripted on purpose
    assert run.rewards == local_control.rewards
    assert run.artifacts == local_control.artifacts  # ctx.artifacts_dir, as LocalBackend leaves it
    assert run.artifacts["row_5_run_0"]["answer.txt"] == b"21\n"
    logs = (run.run_dir / "logs.txt").read_text()
    assert "up to 3 in flight" in logs  # the queue's concurrency, read from /health
    assert "osmosis-harbor: prewarm done" in logs  # while /health answered (no 90 s start-up limit)
    for trial in (run.run_dir / "rollout_trials").iterdir():  # Harbor's logs, where osmosis-ai keeps them
        assert (trial / "logs" / "trial.log").is_file() and (trial / "logs" / "verifier" / "reward.json").is_file()

    again = eval_run(workspace, env, "calc", "harbor")  # --name resumes: the inputs did not change
    assert "already complete" in again.output and "different resolved inputs" not in again.output
    assert source_digest(rollout) == before and not (rollout / "bundles").exists()
    assert list((tmp_path / "tmp").glob("osmosis-harbor-*")) == []
    assert sandbox_sdk.sandboxes_left() == []
