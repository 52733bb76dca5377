"""``osmosis eval run`` (osmosis-ai's local evaluation harness) driving the example workspace,
as a new user runs it: the README's walk-through run as written (a workspace made by
``scripts/eval-workspace.sh``, the harness's own ``uv sync`` of the rollout project, its rollout
server ``main.py`` with HarborBackend on docker, the scripted model of
``python -m osmosis_harbor.testing`` reached through litellm's ``OPENAI_BASE_URL``), and the same
evaluation under osmosis-ai's LocalBackend as the control: the same rewards row for row (five
right, one wrong on purpose), the same artifacts, a run that resumes by name, and a workspace
whose source the run left as it was. The control needs no sandbox and shares nothing with the
walk-through (a workspace, ``$TMPDIR`` and run of its own): it runs while the walk-through's rows
wait on their sandboxes, and the resume while the control finishes. The skypilot-emulator choice of the workspace's config is
the same server on the other SDK path, which the backend's key tests cover on both."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from osmosis_ai.source_scan import source_digest

from osmosis_harbor.testing.scripted_policy import FakeChatServer
from tests.support.common import REPO, wait_until
from tests.support.readme_blocks import block, free_port

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


def start_eval_run(workspace: Path, env: dict[str, str], config: str, name: str) -> subprocess.Popen[str]:
    argv = [str(BIN / "osmosis"), "eval", "run", f"configs/eval/{config}.toml"]
    argv += ["--dataset-file", "data/calc.jsonl", "-y", "--name", name]
    return subprocess.Popen(
        argv,
        cwd=workspace,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish_eval_run(run: subprocess.Popen[str], workspace: Path, name: str) -> EvalRun:
    try:
        output, _ = run.communicate(timeout=HARNESS_TIMEOUT_SEC)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # its rollout server too, should the harness have failed
    run_dir = workspace / ".osmosis" / "evals" / name
    logs = (run_dir / "logs.txt").read_text() if (run_dir / "logs.txt").is_file() else ""
    assert run.returncode == 0, f"{output}\n{logs[-6000:]}"
    return read_run(run_dir, output)


def read_run(run_dir: Path, output: str) -> EvalRun:
    rows = [json.loads(line) for line in (run_dir / "summary.jsonl").read_text().splitlines() if line.strip()]
    artifacts = {
        item.name: {p.relative_to(item).as_posix(): p.read_bytes() for p in sorted(item.rglob("*")) if p.is_file()}
        for item in sorted((run_dir / "artifacts").iterdir())
    }
    return EvalRun(run_dir, {r["row_index"]: r.get("reward") for r in rows}, artifacts, output)


def serving(workspace: Path) -> bool:
    """The harness's log says its rollout server answered ``/health``."""
    logs = list((workspace / ".osmosis" / "evals").glob("*/logs.txt"))
    return any("rollout server healthy" in log.read_text(errors="replace") for log in logs)


def run_walkthrough(home: Path, tmp: Path, while_serving: Callable[[], None]) -> tuple[Path, str]:
    """The README's walk-through as one script, with ``~`` a home of the test's own (uv keeps its
    own cache, as it would for you), ``$TMPDIR`` the test's, and the scripted model on a free port
    instead of 8401 (the machine is shared). ``while_serving`` is called once the harness's rollout
    server answers (the rows then wait on their sandboxes). Returns the workspace and the script's
    output."""
    walkthrough = block("Evaluating with `osmosis eval run`", "bash")
    assert walkthrough.body.count("8401") == 2
    script = "set -e\n" + walkthrough.body.replace("8401", str(free_port()))
    uv_cache = os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")
    env = {**os.environ, "HOME": str(home), "UV_CACHE_DIR": uv_cache, "COLUMNS": "200", "TMPDIR": str(tmp)}
    workspace = home / "calc-eval"
    out, err = home.parent / "walkthrough.out", home.parent / "walkthrough.err"  # files: no pipe to fill
    with out.open("w") as stdout, err.open("w") as stderr:
        shell = subprocess.Popen(
            ["bash", "-c", script], cwd=REPO, env=env, text=True, stdout=stdout, stderr=stderr, start_new_session=True
        )
    try:
        wait_until(
            lambda: shell.poll() is not None or serving(workspace),
            timeout=HARNESS_TIMEOUT_SEC,
            what="the walk-through's rollout server to answer",
        )
        while_serving()
        shell.wait(timeout=HARNESS_TIMEOUT_SEC + 300)
    finally:  # the backgrounded model too, should the script stop before its kill
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
    assert shell.returncode == 0, out.read_text()[-4000:] + err.read_text()[-4000:]
    return workspace, out.read_text()


@pytest.fixture(scope="module")
def policy() -> FakeChatServer:
    replies = json.loads((EXAMPLE / "data" / "calc.replies.json").read_text())
    server = FakeChatServer(default_reply="echo 42", replies=replies)
    yield server
    server.close()


class LocalControl:
    """The same evaluation under osmosis-ai's LocalBackend (``configs/eval/calc-local.toml``), in
    a workspace, ``$TMPDIR`` and run of its own: started while HarborBackend's rows wait on their
    sandboxes (it needs none), its result read after."""

    def __init__(self, policy: FakeChatServer, root: Path) -> None:
        self.policy, self.root = policy, root
        self.run: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.root.mkdir()
        self.workspace = make_workspace(self.root / "workspace", "docker")
        self.run = start_eval_run(self.workspace, harness_env(self.policy, self.root / "tmp"), "calc-local", "control")

    def result(self) -> EvalRun:
        assert self.run is not None, "the control was never started"
        return finish_eval_run(self.run, self.workspace, "control")

    def stop(self) -> None:
        if self.run is not None and self.run.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.run.pid, signal.SIGKILL)
            self.run.communicate()


@pytest.fixture
def local_control(policy: FakeChatServer, tmp_path: Path) -> Iterator[LocalControl]:
    control = LocalControl(policy, tmp_path / "local")
    yield control
    control.stop()  # a test that failed before reading it leaves no harness behind


def test_osmosis_eval_run_drives_the_example_workspace(
    tmp_path: Path, policy: FakeChatServer, local_control: LocalControl
) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    pristine = make_workspace(tmp_path / "pristine", "docker")  # what the script's workspace was made as
    before = source_digest(pristine / "rollouts" / "calc")

    workspace, stdout = run_walkthrough(home, tmp, local_control.start)
    assert "83.3% (5/6 scored" in stdout  # the result the README states
    (run_dir,) = (workspace / ".osmosis" / "evals").glob("*-*")
    run = read_run(run_dir, stdout)
    assert run.rewards == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 0.0}  # 9 + 12 is scripted on purpose
    assert run.artifacts["row_0_run_0"]["answer.txt"] == b"42\n"
    assert run.artifacts["row_5_run_0"]["answer.txt"] == b"21\n"
    logs = (run.run_dir / "logs.txt").read_text()
    assert "up to 3 in flight" in logs  # the queue's concurrency, read from /health
    assert "osmosis-harbor: prewarm done" in logs  # while /health answered (no 90 s start-up limit)
    for trial in (run.run_dir / "rollout_trials").iterdir():  # Harbor's logs, where osmosis-ai keeps them
        assert (trial / "logs" / "trial.log").is_file() and (trial / "logs" / "verifier" / "reward.json").is_file()

    rollout = workspace / "rollouts" / "calc"
    assert source_digest(rollout) == before and not (rollout / "bundles").exists()
    env = {**harness_env(policy, tmp), "HOME": str(home)}
    # --name resumes (the inputs did not change), while the control finishes in its own workspace
    resume = start_eval_run(workspace, env, "calc", run_dir.name)
    try:
        control = local_control.result()
    finally:
        again = finish_eval_run(resume, workspace, run_dir.name)
    assert run.rewards == control.rewards
    assert run.artifacts == control.artifacts  # ctx.artifacts_dir, as LocalBackend leaves it
    assert "already complete" in again.output and "different resolved inputs" not in again.output
    assert source_digest(rollout) == before
    assert list(tmp.glob("osmosis-harbor-*")) == []
