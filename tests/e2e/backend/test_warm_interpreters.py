"""Warm interpreters (``osmosis_harbor/shim/warm.py``, ``handoff.py``): a baked image's ENTRYPOINT
starts a Python that imported ``osmosis_ai``; the agent's and the grader's console scripts hand
their run to it, or run cold.

Real osmosis server and client, real Harbor TrialQueue, real sandboxes on both SDK paths. That a
run was served warm is shown by the run itself: its summary line says ``served=warm`` (the warm
child sets it) and the probe workflow reports the warm child's facts, not by a timing.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.bundle import build_bundle
from osmosis_harbor.bundle.shim import SHIM_PACKAGE as SHIM
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment
from osmosis_harbor.sandbox.guard import guard_binary
from osmosis_harbor.shim import contract
from osmosis_harbor.tasks.dockerfile import WARM_ENTRYPOINT_COMMENT, EnvironmentPatch, patch_environment
from osmosis_harbor.tasks.refs import ResolvedTask
from tests.support.backends import GR, PROJECT, WF, make_backend
from tests.support.common import FIXTURES, TASKS, await_until, graded_template, make_task
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

ANSWER = "Write 42 to answer.txt\nreply: echo 42 > answer.txt"
KEY = f"sk-warm-{uuid.uuid4().hex}"
GUARDED = FIXTURES / "guard_dataset" / "sum-42"  # its tests declare the agent's sandbox (shared)


@pytest.fixture
def warm_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_WARM_INTERPRETERS", "1")


async def rollout(target: HarborBackend, fake_chat, text: str = ANSWER, *, grade: bool = True, **kwargs):
    async with serve(target) as url, client_for(url) as client:
        return await client.run_rollout(
            initial_messages=[{"role": "user", "content": text}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=f"warm-{uuid.uuid4().hex[:8]}",
            llm_api_key=KEY,
            label="42",
            grade=grade,
            **kwargs,
        )


def served(trials: Path, log: str) -> list[str]:
    """The ``served=`` token of each shim summary line in the trials' ``log`` (a path in a trial
    directory: ``agent/workflow.log``, ``verifier/test-stdout.txt``)."""
    tokens = []
    for found in sorted(trials.glob(f"*/{log}")):
        for line in found.read_text().splitlines():
            if line.startswith("osmosis-harbor-shim[") and " served=" in line:
                tokens.append(line.split(" served=", 1)[1].split()[0])
    return tokens


def graded_backend(root: Path, bundles_dir: Path, sdk: SdkPath) -> HarborBackend:
    return make_backend(
        root, bundles_dir, agent="OutputWorkflow", grader="AnswerGrader", tasks_dir=graded_template(root), sdk=sdk
    )


@DOCKER_PATH_ONLY
async def test_a_graded_rollout_is_served_warm_and_gives_the_cold_result(
    tmp_path: Path, bundles_dir: Path, fake_chat, sandbox_sdk: SdkPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("OSMOSIS_HARBOR_WARM_INTERPRETERS", mode)
        root = tmp_path / f"warm-{mode}"
        result = await rollout(graded_backend(root, bundles_dir, sandbox_sdk), fake_chat)
        assert result.status is RolloutStatus.SUCCESS, result.err_message
        results[mode] = result
        expected = "warm" if mode == "1" else "cold"
        assert served(root / "trials", "agent/workflow.log") == [expected]  # the agent's run
        assert served(root / "trials", "verifier/test-stdout.txt") == [expected]  # the grader's, in its own sandbox
    cold, warm = results["0"].sample, results["1"].sample
    assert warm.reward == cold.reward == 1.0
    assert warm.messages == cold.messages and warm.metrics == cold.metrics


@DOCKER_PATH_ONLY
async def test_the_warm_child_takes_the_rollouts_environment_before_the_workflow_is_imported(
    tmp_path: Path, bundles_dir: Path, fake_chat, sandbox_sdk: SdkPath, warm_on: None
) -> None:
    """The probe reads the rollout id at import: imported after the hand-off, it sees it. Its
    key is in no file and in no process's argv in the sandbox."""
    target = make_backend(
        tmp_path,
        bundles_dir,
        agent="WarmProbeWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path),
        sdk=sandbox_sdk,
    )
    result = await rollout(target, fake_chat, "probe")
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    facts = json.loads(result.sample.messages[-1]["content"])
    assert facts["served"] == "served=warm"
    assert facts["imported_with_rollout_id"] == facts["rollout_id"] is not None
    assert facts["key_set"] and facts["key_in_cmdline"] == [] and facts["key_in_files"] == []


@DOCKER_PATH_ONLY
async def test_an_agent_timeout_kills_a_warm_served_run(
    tmp_path: Path, bundles_dir: Path, fake_chat, sandbox_sdk: SdkPath, warm_on: None
) -> None:
    """The probe blocks its event loop, so the shim's own deadline cannot end it: Harbor's agent
    timeout does, through the exec's kill, which reaches the warm-served run (the sandbox test
    below shows the run itself gone)."""
    target = make_backend(
        tmp_path,
        bundles_dir,
        agent="WarmProbeWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path),
        sdk=sandbox_sdk,
    )
    started = time.monotonic()
    result = await rollout(target, fake_chat, "probe block", agent_timeout_sec=10)
    assert result.status is RolloutStatus.FAILURE and result.err_category is RolloutErrorCategory.TIMEOUT, result
    assert time.monotonic() - started < 60
    (blocked,) = (tmp_path / "trials").glob("*/artifacts/logs/artifacts/warm_probe_blocked.json")
    assert json.loads(blocked.read_text())["served"] == "served=warm"


# ── one sandbox, its warm interpreter, and the calls made to it ──────────────────────────────────

CAP_MKNOD = 27  # the capability the verifier guard marks an agent's processes by, where root holds it
PR_CAPBSET_DROP = 24
GUARD_UPLOAD = "/var/tmp/osmosis-guard"


@contextlib.asynccontextmanager
async def warm_sandbox(root: Path, bundles_dir: Path, sdk: SdkPath) -> AsyncIterator[tuple[SandboxEnvironment, str]]:
    """A started sandbox of a baked image with a warm interpreter (the probe workflow's bundle),
    made the way Harbor makes a trial's, and the agent script's path in it."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    info = build_bundle(PROJECT, workflow=f"{WF}:WarmProbeWorkflow", grader=f"{GR}:AnswerGrader", cache_dir=bundles_dir)
    task_dir = make_task(root / "ds", "warm-sandbox", dockerfile="FROM python:3.12-slim\nWORKDIR /workspace\n")
    patch = EnvironmentPatch(requirements=list(info.dependencies), wheel=info.wheel, bundle_key=info.key, warm=True)
    patch_environment(task_dir / "environment", patch)
    task = Task(task_dir)
    paths = TrialPaths(root / "trial")
    paths.mkdir()
    environment = EnvironmentFactory.create_environment_from_config(
        sdk.environment(),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"warm-{uuid.uuid4().hex[:8]}",
        trial_paths=paths,
        task_env_config=task.config.environment,
    )
    assert isinstance(environment, SandboxEnvironment)
    await environment.start(force_build=False)
    try:
        yield environment, f"{contract.VENV}/bin/{info.agent_script}"
    finally:
        await environment.stop(delete=True)


def probe_env(rollout_id: str, text: str = "probe") -> dict[str, str]:
    document = {"rollout_id": rollout_id, "prompt": [{"role": "user", "content": text}], "metadata": {}}
    return {contract.ROLLOUT_INPUT_JSON_ENV: json.dumps(document), contract.ROLLOUT_ID_ENV: rollout_id}


def probe_facts(stdout: str | None) -> dict:
    line = next(line for line in (stdout or "").splitlines() if line.startswith("warm-probe "))
    return json.loads(line.split(" ", 1)[1])


def marked(command: str) -> str:
    """``command`` in a process whose bounding set lacks CAP_MKNOD (a caller with other
    capabilities than the warm interpreter's), run from the bundle's Python."""
    return (
        f"{contract.VENV}/bin/python -c 'import ctypes, os, sys; "
        f"assert ctypes.CDLL(None).prctl({PR_CAPBSET_DROP}, {CAP_MKNOD}) == 0; "
        'os.execv("/bin/sh", ["sh", "-c", sys.argv[1]])\' ' + shlex.quote(command)
    )


def until_listening(seconds: int = 10) -> str:
    """Shell that waits (bounded) for the warm interpreter's socket: a sandbox started a moment ago."""
    return f"for i in $(seq 1 {seconds * 100}); do [ -S {contract.WARM_SOCKET} ] && break; sleep 0.01; done; [ -S {contract.WARM_SOCKET} ]"


def has_mknod(cap_set: str) -> bool:
    return bool(int(cap_set, 16) >> CAP_MKNOD & 1)


@DOCKER_PATH_ONLY
async def test_one_warm_interpreter_serves_one_run_and_the_next_runs_cold(
    tmp_path: Path, bundles_dir: Path, sandbox_sdk: SdkPath
) -> None:
    async with warm_sandbox(tmp_path, bundles_dir, sandbox_sdk) as (sandbox, agent):
        first = await sandbox.exec(agent, env=probe_env("first"))
        second = await sandbox.exec(agent, env=probe_env("second"))
        third = await sandbox.exec(agent, env=probe_env("third"))
    assert first.return_code == second.return_code == third.return_code == 0, (first, second)
    facts = [probe_facts(r.stdout) for r in (first, second, third)]
    assert [f["served"] for f in facts] == ["served=warm", "served=cold", "served=cold"]
    assert [f["imported_with_rollout_id"] for f in facts] == ["first", "second", "third"]
    # the warm child's parent is the warm process, started by the image's ENTRYPOINT
    assert contract.WARM_MODULE in facts[0]["parent"] and contract.WARM_MODULE not in facts[1]["parent"]


@DOCKER_PATH_ONLY
async def test_a_missing_socket_or_other_privileges_run_cold_and_correct(
    tmp_path: Path, bundles_dir: Path, sandbox_sdk: SdkPath
) -> None:
    async with warm_sandbox(tmp_path / "gone", bundles_dir, sandbox_sdk) as (sandbox, agent):
        removed = await sandbox.exec(
            f"{until_listening()} && rm {contract.WARM_SOCKET} && {agent}", env=probe_env("gone")
        )
    assert removed.return_code == 0 and probe_facts(removed.stdout)["served"] == "served=cold"

    async with warm_sandbox(tmp_path / "user", bundles_dir, sandbox_sdk) as (sandbox, agent):
        other_user = await sandbox.exec(agent, env=probe_env("nobody"), user="nobody")
        root_after = await sandbox.exec(agent, env=probe_env("root"))
    assert other_user.return_code == 0 and probe_facts(other_user.stdout)["served"] == "served=cold"
    assert probe_facts(root_after.stdout)["served"] == "served=warm"  # nobody could not even reach it

    async with warm_sandbox(tmp_path / "caps", bundles_dir, sandbox_sdk) as (sandbox, agent):
        dropped = await sandbox.exec(marked(agent), env=probe_env("marked"))
    facts = probe_facts(dropped.stdout)
    assert dropped.return_code == 0 and facts["served"] == "served=cold" and not has_mknod(facts["cap_bnd"])
    assert "declined this run" in (dropped.stderr or "") + (dropped.stdout or "")
    assert "CapBnd" in (dropped.stderr or "") + (dropped.stdout or "")


async def started_guard(sandbox: SandboxEnvironment) -> Callable[[str], str]:
    """The verifier guard started in ``sandbox`` as the agent environment starts it (while the
    sandbox is pristine), and the way it runs an agent command: marked (``drop``)."""
    await sandbox.upload_file(guard_binary().path, GUARD_UPLOAD)
    started = await sandbox.exec(
        f"chmod 755 {GUARD_UPLOAD} && exec {GUARD_UPLOAD} start --id {uuid.uuid4().hex[:16]} --workdir /workspace",
        env={"OSMOSIS_GUARD_KEY": secrets.token_hex(32)},
        user="root",
    )
    assert started.return_code == 0 and (started.stdout or "").startswith("osmosis-guard started pid="), started
    daemon = int((started.stdout or "").split("pid=")[1].split()[0])
    return lambda command: f"/proc/{daemon}/exe drop -- sh -c {shlex.quote(command)}"


@DOCKER_PATH_ONLY
async def test_a_marked_workflow_cannot_run_its_code_unmarked_through_the_warm_interpreter(
    tmp_path: Path, bundles_dir: Path, sandbox_sdk: SdkPath
) -> None:
    """The attack: a workflow the verifier guard marked (its processes lack a capability, so they
    cannot reach unmarked ones) hands a run of its own code to the warm interpreter, which is
    unmarked root, to get that code run unmarked. Protected, the interpreter declines and the code
    runs cold, marked. The positive control is the same attack on a warm interpreter started
    without the check: the code runs with the capability the guard took away. (The product starts
    no warm interpreter where the guard runs, ``test_which_images_start_a_warm_interpreter``; this is
    the check behind that.)"""
    async with warm_sandbox(tmp_path / "checked", bundles_dir, sandbox_sdk) as (sandbox, agent):
        mark = await started_guard(sandbox)
        attack = await sandbox.exec(f"{until_listening()} && {mark(agent)}", env=probe_env("attack"))
    protected = probe_facts(attack.stdout)
    assert protected["served"] == "served=cold" and not has_mknod(protected["cap_bnd"]), attack
    assert "declined this run" in (attack.stderr or "") + (attack.stdout or "")

    unchecked = (
        f"from {SHIM} import handoff, warm; listener = warm.listen(handoff.SOCKET_PATH); warm.preload(); "
        "warm.serve(listener, handoff.SOCKET_PATH, check=lambda conn: None)"
    )
    async with warm_sandbox(tmp_path / "control", bundles_dir, sandbox_sdk) as (sandbox, agent):
        mark = await started_guard(sandbox)
        # the product's warm interpreter is replaced by one without the check, as root, unmarked
        started = await sandbox.exec(
            f"{until_listening()} && rm -f {contract.WARM_SOCKET} && ( {contract.VENV}/bin/python -P -c "
            f"{shlex.quote(unchecked)} </dev/null >/dev/null 2>&1 & ) ; {until_listening()}"
        )
        assert started.return_code == 0, started
        attack = await sandbox.exec(mark(agent), env=probe_env("attack"))
    paid = probe_facts(attack.stdout)
    assert paid["served"] == "served=warm" and has_mknod(paid["cap_bnd"]), attack  # the attack pays


@DOCKER_PATH_ONLY
async def test_a_timed_out_exec_kills_its_warm_served_run(
    tmp_path: Path, bundles_dir: Path, sandbox_sdk: SdkPath
) -> None:
    """Exec timeouts kill the command's session; the warm-served run is in another session (the
    warm process's child), so the warm process kills it when the command's end of the socket
    closes."""
    async with warm_sandbox(tmp_path, bundles_dir, sandbox_sdk) as (sandbox, agent):
        result = await sandbox.exec(agent, env=probe_env("blocked", "probe block"), timeout_sec=4)
        assert result.return_code != 0
        blocked = json.loads((await sandbox.exec("cat /tmp/warm-probe-blocked.json")).stdout or "{}")
        assert blocked.get("served") == "served=warm", blocked

        async def run_is_gone() -> bool:
            alive = await sandbox.exec(f"[ -d /proc/{blocked['pid']} ] || [ -d /proc/{blocked['ppid']} ]")
            return alive.return_code != 0

        await await_until(run_is_gone, timeout=10, what="the warm-served run and its warm process to end")


# ── where the image gets a warm interpreter ─────────────────────────────────────────────────────


def test_the_patch_keeps_a_tasks_own_entrypoint_and_needs_a_baked_bundle(tmp_path: Path) -> None:
    wheel = tmp_path / "bundle-1-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    cases = {
        "FROM debian:trixie-slim\n": True,
        'FROM debian:trixie-slim\nENTRYPOINT ["/init"]\n': False,  # the task's own: kept, no warm interpreter
        'FROM debian:trixie-slim AS base\nENTRYPOINT ["/init"]\nFROM base\nRUN true\n': True,  # not the final stage's
    }
    for index, (dockerfile, warm) in enumerate(cases.items()):
        environment = tmp_path / str(index) / "environment"
        environment.mkdir(parents=True)
        (environment / "Dockerfile").write_text(dockerfile)
        patch_environment(environment, EnvironmentPatch(requirements=[], wheel=wheel, bundle_key="k", warm=True))
        text = (environment / "Dockerfile").read_text()
        assert (WARM_ENTRYPOINT_COMMENT in text) is warm, text
        assert (contract.WARM_MODULE in text) is warm
    with pytest.raises(ValueError, match="baked bundle"):
        EnvironmentPatch(requirements=[], warm=True)


@pytest.mark.parametrize("sdk", ["docker", "skypilot-emulator"])
async def test_which_images_start_a_warm_interpreter(
    tmp_path: Path, bundles_dir: Path, sdk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's default (the SkyPilot path on, docker only with warm pools) unless the setting says, a task
    whose own tests run in a fresh sandbox included; never where the task's tests run in the agent's sandbox
    under the guard (no unmarked root process within a
    marked workflow's reach); never for a native agent (with a grader-only bundle, the agent's
    sandbox would hold an idle root interpreter within its shell's reach)."""
    monkeypatch.delenv("OSMOSIS_HARBOR_WARM_INTERPRETERS", raising=False)

    def warm(target: HarborBackend, task: Path) -> bool:
        copy = target.materialize(
            ResolvedTask(task_id=task.name, path=task, source="template"), tmp_path / uuid.uuid4().hex, request=None
        )
        return WARM_ENTRYPOINT_COMMENT in (copy.path / "environment" / "Dockerfile").read_text()

    environment = environment_config(sdk)
    graded = make_backend(
        tmp_path,
        bundles_dir,
        agent="OutputWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path),
        environment=environment,
    )
    guarded = make_backend(tmp_path, bundles_dir, agent="OutputWorkflow", environment=environment)
    assert warm(graded, graded_template(tmp_path, "graded")) is (sdk != "docker")
    pooled = make_backend(
        tmp_path,
        bundles_dir,
        agent="OutputWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path, "p"),
        environment=environment_config(sdk, pool="warm"),
    )
    assert warm(pooled, graded_template(tmp_path, "pooled"))  # docker: on with warm pools
    assert not warm(guarded, GUARDED)  # its own tests/: run in the agent's sandbox, under the guard
    assert warm(guarded, TASKS / "template") is (sdk != "docker")  # its own tests/, in a fresh sandbox
    monkeypatch.setenv("OSMOSIS_HARBOR_WARM_INTERPRETERS", "1")
    assert warm(graded, graded_template(tmp_path, "graded-on"))
    assert not warm(guarded, GUARDED)
    native = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=graded_template(tmp_path, "native"),
        agent="terminus-2",
        grader=f"{GR}:AnswerGrader",
        grader_config=f"{GR}:fixture_grader_config",
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=environment,
        trials_dir=tmp_path / "native-trials",
    )
    assert native.bundle is not None and not warm(native, graded_template(tmp_path, "native-task"))
    monkeypatch.setenv("OSMOSIS_HARBOR_WARM_INTERPRETERS", "0")
    assert not warm(graded, graded_template(tmp_path, "graded-off"))
    chosen = make_backend(  # the environment's own option wins over the setting
        tmp_path,
        bundles_dir,
        agent="OutputWorkflow",
        grader="AnswerGrader",
        tasks_dir=graded_template(tmp_path, "c"),
        environment=environment_config(sdk, warm_interpreters=True),
    )
    assert warm(chosen, graded_template(tmp_path, "chosen"))
