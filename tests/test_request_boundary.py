"""Requests cannot point at the host (issue 14, item 5), through HarborBackend and the real
osmosis server: a local ``harbor_task`` resolves inside ``tasks_dir`` or ``task_roots`` and never
into a trials directory; git refs are remote unless ``allow_local_git=True``; refusals are
``validation_error``s that name the ref as given, never the host path it resolved to.

Positive controls: the same task copy runs (oracle, reward 1) from an allowed root, and a real
local git repository runs once ``allow_local_git=True``.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.agents.native import NotTrainableWarning
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.settings import Settings

from .rollout_server import client_for, serve
from .support import TASKS

pytestmark = [pytest.mark.usefixtures("osmosis_home")]


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A dataset, an extra allowed root holding the trials dir, and a task outside every root
    (an identical copy, so only where it lives differs)."""
    dataset = tmp_path / "dataset"
    shutil.copytree(TASKS / "json-reward", dataset / "json-reward")
    extra = tmp_path / "extra"
    shutil.copytree(TASKS / "json-reward", extra / "extra-task")
    outside = shutil.copytree(TASKS / "json-reward", tmp_path / "outside" / "secret-task")
    trials = extra / "trials"  # inside an allowed root, as an operator might lay it out
    planted = shutil.copytree(TASKS / "json-reward", trials / "planted")  # what a sandbox could leave
    (dataset / "link").symlink_to(outside, target_is_directory=True)
    (extra / "sneaky").symlink_to(planted, target_is_directory=True)
    broken = shutil.copytree(TASKS / "json-reward", extra / "hidden" / "no-instruction")
    (broken / "instruction.md").unlink()
    (extra / "alias").symlink_to(broken, target_is_directory=True)
    return {"dataset": dataset, "extra": extra, "outside": outside, "trials": trials, "planted": planted}


@pytest.fixture
def task_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Harbor's git task cache in the test's tmp dir, not ~/.cache (bound at Harbor's import)."""
    import harbor.constants
    import harbor.models.task.id
    import harbor.tasks.client

    cache = tmp_path / "harbor-cache"
    for module in (harbor.constants, harbor.models.task.id, harbor.tasks.client):
        monkeypatch.setattr(module, "TASK_CACHE_DIR", cache)
    return cache


@pytest.fixture
def git_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A real repository made with ``git init`` holding tasks/json-reward: (bare clone, commit)."""
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{var}_NAME", "test")
        monkeypatch.setenv(f"GIT_{var}_EMAIL", "test@example.invalid")
    work = tmp_path / "gitwork"
    shutil.copytree(TASKS / "json-reward", work / "tasks" / "json-reward")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=work, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    git("add", ".")
    git("commit", "-q", "-m", "tasks")
    bare = tmp_path / "repo.git"
    git("clone", "-q", "--bare", str(work), str(bare))
    return bare, git("rev-parse", "HEAD")


def backend_for(host: dict[str, Path], **kwargs: object) -> HarborBackend:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotTrainableWarning)  # the oracle is the point here
        return HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=host["dataset"],
            task_mode="dataset",
            agent="oracle",
            environment_config=environment_config("docker"),
            trials_dir=host["trials"],
            **kwargs,  # type: ignore[arg-type]
        )


async def rollout(url: str, metadata: dict[str, str]):
    async with client_for(url) as client:
        return await client.run_rollout(
            initial_messages=[{"role": "user", "content": "validate"}],
            chat_completions_url="http://unused.invalid/v1",
            rollout_id=f"ref-{uuid.uuid4().hex[:8]}",
            metadata=metadata,
        )


def assert_refused(result, match: str, *hidden: Path) -> None:
    assert result.status is RolloutStatus.FAILURE, result
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR, result.err_message
    assert match in result.err_message, result.err_message
    for path in hidden:  # the resolved host path stays on the host
        assert str(path) not in result.err_message, result.err_message


async def test_local_refs_stay_inside_the_allowed_roots(host: dict[str, Path]) -> None:
    backend = backend_for(host, task_roots=[host["extra"]])
    async with serve(backend) as url:
        # Positive control: a task in an allowed root runs; its identical copy outside does not.
        allowed = await rollout(url, {"harbor_task": str(host["extra"] / "extra-task")})
        assert allowed.status is RolloutStatus.SUCCESS, allowed.err_message
        assert allowed.sample.reward == 1.0
        outside = await rollout(url, {"harbor_task": str(host["outside"])})
        assert_refused(outside, "outside tasks_dir and the allowed task roots")
        missing = await rollout(url, {"harbor_task": str(host["outside"].parent / "nope")})
        assert_refused(missing, "outside tasks_dir")  # refused before existence is looked at
        # A symlink inside tasks_dir pointing out of it: named as given, its target never shown.
        linked = await rollout(url, {"harbor_task": "./link"})
        assert_refused(linked, "metadata['harbor_task']='./link' is outside tasks_dir", host["outside"])
        # The trials dir is inside an allowed root, and still refused, directly and through a link.
        planted = await rollout(url, {"harbor_task": str(host["planted"])})
        assert_refused(planted, "points into a trials directory")
        sneaky = await rollout(url, {"harbor_task": str(host["extra"] / "sneaky")})
        assert_refused(sneaky, "points into a trials directory", host["planted"])
        # An allowed task that is invalid is named as requested, not by where its link leads.
        invalid = await rollout(url, {"harbor_task": str(host["extra"] / "alias")})
        assert_refused(invalid, "instruction.md is missing", host["extra"] / "hidden")
        # The dataset id route knows the same boundary.
        through_id = await rollout(url, {"harbor_task_id": "link"})
        assert_refused(through_id, "leads outside tasks_dir", host["outside"])


async def test_local_git_needs_allow_local_git(
    host: dict[str, Path], git_repo: tuple[Path, str], task_cache: Path
) -> None:
    bare, commit = git_repo
    ref = {"harbor_task": "tasks/json-reward", "git_commit_id": commit}
    refused = backend_for(host)
    async with serve(refused) as url:
        for git_url in (bare.as_uri(), str(bare)):
            result = await rollout(url, {**ref, "git_url": git_url})
            assert_refused(result, "is a repository on this machine, and local git refs are off")
        for hostile in ("--upload-pack=touch /tmp/pwned", "ext::sh -c touch% /tmp/pwned", "http://example.invalid/r"):
            assert_refused(await rollout(url, {**ref, "git_url": hostile}), "is not a git URL")
    assert not task_cache.exists()  # nothing was fetched

    allowed = backend_for(host, allow_local_git=True)
    async with serve(allowed) as url:
        result = await rollout(url, {**ref, "git_url": bare.as_uri()})
        assert result.status is RolloutStatus.SUCCESS, result.err_message
        assert result.sample.reward == 1.0
        # Opting in to local repositories does not open other transports.
        for hostile in ("--upload-pack=touch /tmp/pwned", "ext::sh -c touch% /tmp/pwned"):
            assert_refused(await rollout(url, {**ref, "git_url": hostile}), "is not a git URL")
        # Nor a repository inside the trials directory.
        in_trials = shutil.copytree(bare, host["trials"] / "repo.git")
        assert_refused(await rollout(url, {**ref, "git_url": in_trials.as_uri()}), "points into a trials directory")


def test_roots_and_local_git_come_from_the_settings_when_not_given(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_TASK_ROOTS", f"{host['extra']}:{host['outside'].parent}")
    monkeypatch.setenv("OSMOSIS_HARBOR_ALLOW_LOCAL_GIT", "1")
    assert Settings().task_root_paths() == (host["extra"], host["outside"].parent)
    roots = backend_for(host).resolver.roots
    assert roots.allow_local_git and host["outside"].parent.resolve() in roots.allowed
    explicit = backend_for(host, task_roots=[], allow_local_git=False).resolver.roots
    assert not explicit.allow_local_git and host["outside"].parent.resolve() not in explicit.allowed
    with pytest.raises(ConfigError, match="task_roots: .* is not a directory"):
        backend_for(host, task_roots=[host["outside"] / "missing"])


@pytest.mark.parametrize(
    ("url", "local_ok", "remote"),
    [
        ("https://oauth2:token@git.example.com/org/repo.git", False, True),
        ("ssh://git@git.example.com/org/repo", False, True),
        ("git@github.com:org/repo.git", False, True),
        ("https://[::1]:8443/repo", False, True),
        ("file:///srv/repo.git", True, False),
        ("/srv/repo.git", True, False),
        ("http://git.example.com/repo", False, False),  # plain http: refused like any other scheme
        ("git://git.example.com/repo", False, False),
        ("ssh://-oProxyCommand=touch%20x/repo", False, False),  # a host git would read as an option
        ("git@-oProxyCommand=x:repo", False, False),
        ("ext::sh -c touch% x", False, False),
        ("--upload-pack=touch x", False, False),
    ],
)
def test_git_url_forms(url: str, local_ok: bool, remote: bool) -> None:
    from osmosis_harbor.errors import TaskResolutionError
    from osmosis_harbor.tasks.roots import TaskRoots

    for allow in (False, True):
        roots = TaskRoots([], allow_local_git=allow)
        if remote or (allow and local_ok):
            roots.check_git_url(url, "metadata['git_url']", url)
        else:
            with pytest.raises(TaskResolutionError, match=r"metadata\['git_url'\]="):
                roots.check_git_url(url, "metadata['git_url']", url)
