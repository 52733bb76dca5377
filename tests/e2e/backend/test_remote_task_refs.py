"""Remote task refs through ``HarborBackend`` and the real osmosis server (docs/rollouts.md, "What a rollout runs"):
a git task (``metadata["harbor_task"]`` + ``git_url`` + ``git_commit_id``, from a real git
repository this test makes with ``git init``) and a registry package (``org/name@sha256:...``,
found in Harbor's own package cache, the registry itself unreachable and refused).

Each remote task is the bundled template with its own instruction and an answer of its own
in ``tests/test.sh``, so a reward of 1 shows the remote copy is the one that ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from harbor.db.client import RegistryDB
from harbor.publisher.packager import Packager
from harbor.publisher.publisher import Publisher
from harbor.storage.supabase import SupabaseStorage
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from tests.support.common import FIXTURES, TASKS, managed_containers
from tests.support.rollout_server import client_for, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]


def _remote_task(dest: Path, answer: str) -> Path:
    task = shutil.copytree(TASKS / "template", dest)
    (task / "instruction.md").write_text(f"Write {answer} to answer.txt.\n")
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace("osmosis", answer))
    return task


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    (tmp_path / "gitconfig").write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{var}_NAME", "test")
        monkeypatch.setenv(f"GIT_{var}_EMAIL", "test@example.invalid")
    work = tmp_path / "gitwork"
    _remote_task(work / "tasks" / "from-git", "fromgit")
    _git("init", "-q", "-b", "main", cwd=work)
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "a task", cwd=work)
    commit = _git("rev-parse", "HEAD", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(tmp_path / "repo.git"), cwd=tmp_path)
    return (tmp_path / "repo.git").as_uri(), commit


@pytest.fixture
def harbor_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Harbor's task and package caches under the test's tmp dir, its registry refused."""
    import harbor.constants
    import harbor.tasks.client

    cache = tmp_path / "harbor-cache"
    monkeypatch.setattr(harbor.constants, "TASK_CACHE_DIR", cache / "tasks")
    monkeypatch.setattr(harbor.tasks.client, "TASK_CACHE_DIR", cache / "tasks")
    monkeypatch.setattr(harbor.constants, "PACKAGE_CACHE_DIR", cache / "packages")

    async def offline(*args: object, **kwargs: object) -> object:
        raise AssertionError("the Harbor registry was contacted")

    monkeypatch.setattr(RegistryDB, "resolve_task_version", offline)
    monkeypatch.setattr(RegistryDB, "record_task_download", offline)
    monkeypatch.setattr(SupabaseStorage, "download_file", offline)
    return cache


def _cached_package(tmp_path: Path, cache: Path) -> str:
    """Publish the package the way Harbor's publisher packs it, into Harbor's package cache."""
    source = _remote_task(tmp_path / "pkg-src", "frompackage")
    content_hash, files = Packager.compute_content_hash(source)
    archive = tmp_path / "dist.tar.gz"
    Publisher._create_archive(source.resolve(), files, archive)
    target = cache / "packages" / "acme" / "from-package" / content_hash
    target.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(path=target, filter="data")  # how Harbor's TaskClient unpacks a download
    return f"acme/from-package@sha256:{content_hash}"


async def test_git_and_registry_tasks_run_through_the_backend(
    tmp_path: Path, bundles_dir: Path, fake_chat, git_task: tuple[str, str], harbor_caches: Path
) -> None:
    url, commit = git_task
    package = _cached_package(tmp_path, harbor_caches)
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=2),
        tasks_dir=TASKS,
        task_mode="dataset",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=bundles_dir,
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
        allow_local_git=True,  # a file:// repository on this machine
    )
    async with serve(backend) as server, client_for(server) as client:

        async def run(answer: str, metadata: dict[str, str]):
            return await client.run_rollout(
                initial_messages=[{"role": "user", "content": f"reply: echo {answer} > answer.txt"}],
                chat_completions_url=fake_chat.base_url,
                rollout_id=f"remote-{uuid.uuid4().hex[:8]}",
                llm_api_key="sk-remote-refs",
                metadata=metadata,
            )

        from_git = await run("fromgit", {"harbor_task": "tasks/from-git", "git_url": url, "git_commit_id": commit})
        from_package = await run("frompackage", {"harbor_task": package})
        wrong = await run("osmosis", {"harbor_task": package})  # the bundled template's answer: not this task's
    assert from_git.status is RolloutStatus.SUCCESS, from_git.err_message
    assert from_git.sample.reward == 1.0
    assert from_package.status is RolloutStatus.SUCCESS, from_package.err_message
    assert from_package.sample.reward == 1.0
    assert wrong.status is RolloutStatus.SUCCESS and wrong.sample.reward == 0.0  # the control
    assert any((harbor_caches / "tasks").rglob("from-git")), "the git task came through Harbor's task cache"
    assert not managed_containers(owner_pid=os.getpid())
