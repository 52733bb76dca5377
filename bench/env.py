"""What every benchmark shares: the fixture workflow project, a backend factory, the
scripted policy, one-rollout helpers and the hygiene checks (no sandbox, pool or image
left behind by this process).

The backends are built exactly as the end-to-end tests build them
(``environment_config("docker")``, the fixture project
``tests/fixtures/rollout_project``, the template task ``tasks/template``), so the figures
describe the code path the tests prove correct.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.types import ExecutionOutcome, ExecutionRequest

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.images import builds as images
from osmosis_harbor.sandbox.images import holds as image_holds

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "tasks" / "template"
PROJECT = REPO / "tests" / "fixtures" / "rollout_project"
WF = "rollout_fixtures.workflows"
GR = "rollout_fixtures.graders"
API_KEY = "sk-bench-not-a-secret"
POOL_PREFIX = f"bench{os.getpid()}"
_SHIM_ELAPSED = re.compile(r"osmosis-harbor-shim\[agent\].* ok .*elapsed=([0-9.]+)s")
_GRADER_ELAPSED = re.compile(r"osmosis-harbor-shim\[verifier\].* ok .*elapsed=([0-9.]+)s")


def make_backend(
    work: Path,
    *,
    agent: str = "ListWorkflow",
    n_concurrent: int = 1,
    tasks_dir: Path | None = None,
    task_mode: str = "template",
    cleanup_successful_trials: bool = True,
    max_queue_depth: int | None = None,
    grader: str | None = None,
    sdk: str = "docker",
    workers: int = 1,
    **env_kwargs: Any,
) -> HarborBackend:
    """A HarborBackend on sandboxes of ``sdk`` (local Docker by default) that reach a policy on
    127.0.0.1 through the backend's relay.

    ``grader``: a class name in the fixture project's ``rollout_fixtures.graders``. ``tasks_dir``:
    ``TEMPLATE`` as it is when called (a test gives a run a template copy of its own, so that the
    images the run builds and removes are its own).
    """
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=n_concurrent),
        tasks_dir=tasks_dir or TEMPLATE,
        task_mode=task_mode,
        agent=f"{WF}:{agent}",
        workflow_config=f"{WF}:fixture_config" if agent in {"ListWorkflow", "OutputWorkflow"} else None,
        grader=f"{GR}:{grader}" if grader else None,
        grader_config=f"{GR}:fixture_grader_config" if grader == "AnswerGrader" else None,
        code_dir=PROJECT,
        bundles_dir=work / "bundles",
        environment_config=environment_config(sdk, **env_kwargs),
        trials_dir=work / "trials",
        cleanup_successful_trials=cleanup_successful_trials,
        max_queue_depth=max_queue_depth,
        workers=workers,
    )


async def dispose(backend: HarborBackend) -> None:
    """``shutdown()`` plus removal of the backend's private temp root, which shutdown keeps."""
    try:
        await backend.shutdown()
    finally:
        shutil.rmtree(backend.workspace.root, ignore_errors=True)


def request(
    rollout_id: str,
    text: str = "go",
    *,
    grade: bool = False,
    agent_timeout_sec: float | None = None,
    label: str | None = None,
) -> ExecutionRequest:
    return ExecutionRequest(
        id=rollout_id,
        prompt=[{"role": "user", "content": text}],
        grade=grade,
        agent_timeout_sec=agent_timeout_sec,
        label=label,
    )


async def run_rollout(
    backend: HarborBackend,
    chat_url: str,
    rollout_id: str,
    text: str = "go",
    *,
    grade: bool = False,
    agent_timeout_sec: float | None = None,
    label: str | None = None,
) -> ExecutionOutcome:
    """``execute()`` inside a RolloutContext, which is all the osmosis server adds around it."""
    with RolloutContext(chat_completions_url=chat_url, api_key=API_KEY, rollout_id=rollout_id):
        return await backend.execute(
            request(rollout_id, text, grade=grade, agent_timeout_sec=agent_timeout_sec, label=label)
        )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def shim_elapsed(trials_dir: Path, trial_name: str) -> float | None:
    """The in-container agent runner's own elapsed time (its last log line), if present."""
    log = trials_dir / trial_name / "agent" / "workflow.log"
    try:
        matches = _SHIM_ELAPSED.findall(log.read_text(errors="replace"))
    except OSError:
        return None
    return float(matches[-1]) if matches else None


def grader_elapsed(trials_dir: Path, trial_name: str) -> float | None:
    """The Osmosis grader's own elapsed time (the verifier shim's log line in the output of
    the generated ``tests/test.sh``), if present."""
    log = trials_dir / trial_name / "verifier" / "test-stdout.txt"
    try:
        matches = _GRADER_ELAPSED.findall(log.read_text(errors="replace"))
    except OSError:
        return None
    return float(matches[-1]) if matches else None


def grader_task(work: Path) -> Path:
    """The template task without ``tests/``, so the generated test.sh (the grader) verifies it."""
    task = Path(shutil.copytree(TEMPLATE, work / "template-graded"))
    shutil.rmtree(task / "tests")
    return task


def outcome_ok(outcome: ExecutionOutcome) -> bool:
    return outcome.result.status.value == "success"


BUILT_IMAGES: list[str] = []  # every image an owner of this run built, for removal at its end


def note_builds() -> None:
    """Note in ``BUILT_IMAGES`` what every owner's build coordinator builds (builds belong to
    owners, and a run makes many)."""
    ensure = images.ImageBuildCoordinator.ensure
    if getattr(ensure, "notes_builds", False):
        return

    async def noting(self: images.ImageBuildCoordinator, ref: str, **kwargs: Any) -> bool:
        built = await ensure(self, ref, **kwargs)
        if built:
            BUILT_IMAGES.append(ref)
        return built

    noting.notes_builds = True  # type: ignore[attr-defined]
    images.ImageBuildCoordinator.ensure = noting  # type: ignore[method-assign]


# ── hygiene ──────────────────────────────────────────────────────────────────────────────────


def managed_containers(owner_pid: int | None = None) -> list[dict[str, Any]]:
    """Containers of the Docker sandbox emulation (optionally only one process's), one list call."""
    filters = [L.MANAGED_FILTER] + ([f"{L.OWNER_PID}={owner_pid}"] if owner_pid is not None else [])
    return docker.from_env().api.containers(all=True, filters={"label": filters})


def remove_images(refs: list[str]) -> list[str]:
    """Remove image tags this run built, except those another live process uses (they are
    content-addressed and shared: ``images/holds.py``); returns the ones kept or not removed."""
    failed: list[str] = []
    for ref in refs:
        kept = image_holds.remove_unheld(ref)
        if kept is not None:
            failed.append(kept)
    return failed


def image_exists(ref: str) -> bool:
    return images.local_image_exists(ref)


def own_pool(name: str, pid: int | None = None) -> bool:
    """Whether pool ``name`` is this process's (or the benchmark process ``pid``'s): ``bench<pid>``
    or ``bench<pid>-...``, not another process's whose pid merely starts with this one's
    (``bench12`` is not ``bench123``'s)."""
    prefix = POOL_PREFIX if pid is None else f"bench{pid}"
    return name == prefix or name.startswith(f"{prefix}-")


def leftovers() -> list[str]:
    """What this process still owns on the engine: sandboxes, pool members, pools."""
    found = [f"container {c['Names'][0].lstrip('/')} ({c['State']})" for c in managed_containers(os.getpid())]
    try:
        found += [f"pool {p.spec.name}" for p in docker_sdk.list_pools() if own_pool(p.spec.name)]
    except Exception as exc:  # hygiene must report, not crash the run
        found.append(f"could not list pools: {exc}")
    return found


def cleanup_process() -> list[str]:
    """Last resort: remove everything this process still owns; returns what was removed."""
    removed = [f"container {r.name}" for r in docker_sdk.remove_all(owner_pid=os.getpid())]
    for pool in docker_sdk.list_pools():
        if own_pool(pool.spec.name):
            docker_sdk.delete_pool(pool.spec.name)
            removed.append(f"pool {pool.spec.name}")
    return removed


def workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"osmosis-bench-{prefix}-"))
