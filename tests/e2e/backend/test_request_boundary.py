"""Requests cannot point at the host, through HarborBackend
and the real osmosis server: a local ``harbor_task`` resolves inside ``tasks_dir`` or
``task_roots`` and never into a trials directory; git refs are remote unless
``allow_local_git=True``, and their hosts public unless ``allow_private_git_hosts=True``, with
git made to connect to the address checked; refusals are ``validation_error``s that name the ref
as given, never the host path it resolved to.

Positive controls: the same task copy runs (oracle, reward 1) from an allowed root, a real local
git repository runs once ``allow_local_git=True``, and an https git server of the test's own on
127.0.0.1 serves the task once ``allow_private_git_hosts=True``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.agents.native import NotTrainableWarning
from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.settings import Settings
from tests.support.common import TASKS
from tests.support.git_server import PINNED_NAME, SmartGitServer, self_signed
from tests.support.rollout_server import client_for, serve

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
        ("ssh://[-oProxyCommand=touch%20x]/repo", False, False),  # the same, bracketed
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


# ── git hosts: a request's git_url cannot aim this machine's network ─────────────────────────


@pytest.fixture
def git_https(tmp_path: Path, git_repo: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[SmartGitServer]:
    """The test's repository behind an https git server of its own on 127.0.0.1 (``/repo.git``),
    its certificate trusted by git through ``GIT_SSL_CAINFO``."""
    bare, _ = git_repo
    subprocess.run(["git", "config", "uploadpack.allowFilter", "true"], cwd=bare, check=True)
    subprocess.run(["git", "config", "uploadpack.allowAnySHA1InWant", "true"], cwd=bare, check=True)
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("GIT_SSL_CAINFO", str(cert))
    server = SmartGitServer(bare.parent, cert, key)
    yield server
    server.close()


NOT_PUBLIC = [
    ("https://127.0.0.1/r.git", "is a loopback address"),
    ("https://127.8.9.10:8443/r.git", "is a loopback address"),
    ("https://10.20.30.40/r.git", "is a private address"),
    ("https://172.16.0.1/r.git", "is a private address"),
    ("https://172.31.255.254/r.git", "is a private address"),
    ("https://192.168.1.1/r.git", "is a private address"),
    ("https://169.254.169.254/r.git", "is a link-local address"),  # cloud metadata services
    ("https://[::1]/r.git", "is a loopback address"),
    ("https://[fc00::1]/r.git", "is a private address"),
    ("https://[fdab:cdef::1]/r.git", "is a private address"),
    ("https://[fe80::1]/r.git", "is a link-local address"),
    ("https://[::ffff:127.0.0.1]/r.git", "is a loopback address"),  # IPv4-mapped IPv6
    ("https://[::ffff:10.0.0.1]/r.git", "is a private address"),
    ("https://[2002:7f00:1::]/r.git", "is a loopback address"),  # 6to4, carrying 127.0.0.1
    ("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/r.git", "is a loopback address"),  # Teredo, the same
    # IPv4 inside IPv6, judged as the IPv4 it carries (Python calls the first three "global")
    ("https://[::7f00:1]/r.git", "is a loopback address"),  # IPv4-compatible
    ("https://[::127.0.0.1]/r.git", "is a loopback address"),  # the same, dotted
    ("https://[::a9fe:a9fe]/r.git", "is a link-local address"),  # 169.254.169.254, compatible
    ("https://[64:ff9b::7f00:1]/r.git", "is a loopback address"),  # NAT64's well-known prefix
    ("https://[64:ff9b::10.1.2.3]/r.git", "is a private address"),
    ("https://[64:ff9b:1::808:808]/r.git", "is a private address"),  # NAT64 for local use only
    ("https://[::ffff:0:127.0.0.1]/r.git", "is a loopback address"),  # IPv4-translated
    ("https://[2002:a9fe:a9fe::1]/r.git", "is a link-local address"),  # 6to4
    ("https://[2001:0:7f00:1::1]/r.git", "is a loopback address"),  # Teredo, its server
    ("https://0.0.0.0/r.git", "is an unspecified address"),  # Linux connects that to the loopback
    ("https://2130706433/r.git", "resolves to 127.0.0.1"),  # decimal
    ("https://0177.0.0.1/r.git", "resolves to 127.0.0.1"),  # octal
    ("https://0x7f000001/r.git", "resolves to 127.0.0.1"),  # hex
    ("https://0x7f.1/r.git", "resolves to 127.0.0.1"),  # short hex
    ("https://localhost/r.git", "resolves to 127.0.0.1"),  # a name resolving to the loopback
    ("https://user:token@localhost:8443/r.git", "resolves to 127.0.0.1"),
    ("ssh://git@127.0.0.1/r.git", "is a loopback address"),
    ("ssh://git@[::1]:2222/r.git", "is a loopback address"),
    ("git@localhost:org/r.git", "resolves to 127.0.0.1"),
    ("git@192.168.0.10:org/r.git", "is a private address"),
]


@pytest.mark.parametrize(("url", "why"), NOT_PUBLIC)
def test_git_hosts_that_are_not_public_are_refused_unless_allowed(url: str, why: str) -> None:
    from osmosis_harbor.errors import TaskResolutionError
    from osmosis_harbor.tasks.roots import TaskRoots

    refusing = TaskRoots([])
    refusing.check_git_url(url, "metadata['git_url']", url)  # a well-formed remote URL...
    with pytest.raises(TaskResolutionError, match=rf"metadata\['git_url'\]=.*{why}.*allow_private_git_hosts=True"):
        refusing.pin_git_host(url, "metadata['git_url']", url)  # ...whose host is refused
    assert TaskRoots([], allow_private_git_hosts=True).pin_git_host(url, "metadata['git_url']", url) is None


PUBLIC = [
    "https://8.8.8.8/r.git",
    "https://[2606:4700::1111]/r.git",
    "git@1.1.1.1:org/r",
    # a public IPv4 inside IPv6 stays public
    "https://[::ffff:8.8.8.8]/r.git",
    "https://[64:ff9b::808:808]/r.git",
    "https://[2002:808:808::1]/r.git",
]


@pytest.mark.parametrize("url", PUBLIC)
def test_public_git_hosts_are_pinned_to_what_was_checked(url: str) -> None:
    from osmosis_harbor.tasks.roots import TaskRoots

    pin = TaskRoots([]).pin_git_host(url, "metadata['git_url']", url)
    assert pin is not None and pin.addresses == (
        urlsplit(url.replace("git@", "ssh://git@").replace(":org", "/org")).hostname,
    )


@pytest.mark.parametrize(
    "url",
    [
        "ssh://[-oProxyCommand=touch x]/y",  # bracketed, so past a host check that reads the first character
        "ssh://-oProxyCommand=touch%20x/y",
        "ssh://-oProxyCommand=x@git.example.com/y",  # an option-looking user
        "ssh://[git.example.com]/y",  # brackets hold an IPv6 literal only
        "git@-oProxyCommand=x:repo",
        "-oProxyCommand=x@git.example.com:repo",
        "https://a@b@127.0.0.1/r.git",  # which @ ends the user is each parser's guess
        "https://git.example.com#@127.0.0.1/r.git",
        "https://git.example.com\\@127.0.0.1/r.git",
        "https://127.0.0.1:0/r.git",
    ],
)
def test_option_looking_and_ambiguous_git_hosts_are_refused_by_our_own_check(url: str) -> None:
    from osmosis_harbor.errors import TaskResolutionError
    from osmosis_harbor.tasks.roots import TaskRoots

    for roots in (TaskRoots([]), TaskRoots([], allow_local_git=True, allow_private_git_hosts=True)):
        with pytest.raises(TaskResolutionError, match="is not a git URL"):
            roots.check_git_url(url, "metadata['git_url']", url)


def test_git_connects_to_the_checked_address_and_follows_no_redirect(git_https: SmartGitServer) -> None:
    """A pin makes git connect where the host was checked, not where a new lookup would lead
    (``pinned.invalid`` resolves nowhere: only the pin reaches the server); and a redirect,
    whose target was never checked, is not followed. Controls: without the pin, git cannot
    reach the name, and follows the same redirect."""
    from osmosis_harbor.tasks.git_hosts import GitPin, GitRemote

    pinned_url = f"https://{PINNED_NAME}:{git_https.port}/repo.git"
    pin = GitPin(GitRemote("https", PINNED_NAME, git_https.port), ("127.0.0.1",))
    listed = subprocess.run(["git", "ls-remote", pinned_url], env=pin.environment(os.environ), capture_output=True)
    assert listed.returncode == 0 and b"refs/heads/main" in listed.stdout, listed.stderr
    unpinned = subprocess.run(["git", "ls-remote", pinned_url], capture_output=True)
    assert unpinned.returncode != 0 and b"resolve" in unpinned.stderr.lower()

    moved = f"{git_https.url}/moved/repo.git"
    loopback = GitPin(GitRemote("https", "127.0.0.1", git_https.port), ("127.0.0.1",))
    refused = subprocess.run(["git", "ls-remote", moved], env=loopback.environment(os.environ), capture_output=True)
    assert refused.returncode != 0 and b"returned error: 301" in refused.stderr, refused.stderr
    followed = subprocess.run(["git", "ls-remote", moved], capture_output=True)
    assert followed.returncode == 0 and b"refs/heads/main" in followed.stdout, followed.stderr


async def test_a_git_url_on_this_machine_is_refused_and_fetched_once_allowed(
    host: dict[str, Path], git_repo: tuple[Path, str], task_cache: Path, git_https: SmartGitServer
) -> None:
    _, commit = git_repo
    ref = {"harbor_task": "tasks/json-reward", "git_commit_id": commit}
    urls = {
        f"{git_https.url}/repo.git": "is a loopback address",
        f"https://localhost:{git_https.port}/repo.git": "resolves to 127.0.0.1",
    }
    async with serve(backend_for(host)) as url:
        for git_url, why in urls.items():
            assert_refused(await rollout(url, {**ref, "git_url": git_url}), why)
    assert git_https.requests == [] and not task_cache.exists()  # nothing connected, nothing fetched

    async with serve(backend_for(host, allow_private_git_hosts=True)) as url:  # the positive control
        for git_url in urls:
            result = await rollout(url, {**ref, "git_url": git_url})
            assert result.status is RolloutStatus.SUCCESS, result.err_message
            assert result.sample.reward == 1.0
    assert any("git-upload-pack" in path for path in git_https.requests)


def test_private_git_hosts_come_from_the_settings_when_not_given(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_ALLOW_PRIVATE_GIT_HOSTS", "1")
    assert backend_for(host).resolver.roots.allow_private_git_hosts
    assert not backend_for(host, allow_private_git_hosts=False).resolver.roots.allow_private_git_hosts


async def test_a_pinned_fetch_runs_harbors_git_download_against_the_checked_address(
    git_repo: tuple[Path, str], task_cache: Path, git_https: SmartGitServer
) -> None:
    """Harbor's own download (clone, sparse checkout, fetch of the commit) through our client:
    every git command connects to the pinned address (the name resolves nowhere), and a
    checkout using git-lfs, whose downloads go anywhere, is refused on a pinned fetch."""
    from harbor.models.task.id import GitTaskId

    from osmosis_harbor.errors import TaskResolutionError
    from osmosis_harbor.tasks.git_client import PinnedTaskClient
    from osmosis_harbor.tasks.git_hosts import GitPin, GitRemote
    from osmosis_harbor.tasks.remote import RemoteTasks

    bare, commit = git_repo
    pin = GitPin(GitRemote("https", PINNED_NAME, git_https.port), ("127.0.0.1",))
    task_id = GitTaskId(
        git_url=f"https://{PINNED_NAME}:{git_https.port}/repo.git", git_commit_id=commit, path=Path("tasks/json-reward")
    )
    remote = RemoteTasks(task_cache, lambda *args: None)
    result = await remote._download(task_id, task_cache, task_cache, "the task", pin=pin)
    assert (Path(result.path) / "task.toml").is_file() and result.resolved_git_commit_id == commit

    # Harbor pulls LFS objects when the checkout's .gitattributes asks for them: not on a pinned fetch
    checkout = bare.parent / "lfs-checkout"
    checkout.mkdir()
    (checkout / ".gitattributes").write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    with pytest.raises(TaskResolutionError, match="uses git-lfs"):
        await PinnedTaskClient(pin)._pull_lfs_files(checkout, [])


def test_a_pin_keeps_the_operators_git_configuration_and_pins_ssh_too() -> None:
    from osmosis_harbor.tasks.git_hosts import GitPin, GitRemote

    operator = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.proxy", "GIT_CONFIG_VALUE_0": "http://proxy:3128"}
    env = GitPin(GitRemote("https", "git.example.com", 443), ("93.184.216.34", "2606:2800::1")).environment(operator)
    assert env["GIT_CONFIG_KEY_0"] == "http.proxy" and env["GIT_CONFIG_COUNT"] == "3"
    pinned = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in (1, 2)}
    assert pinned == {
        "http.followRedirects": "false",
        "http.curloptResolve": "git.example.com:443:93.184.216.34,[2606:2800::1]",
    }
    assert env["GIT_ALLOW_PROTOCOL"] == "https"
    ssh = GitPin(GitRemote("ssh", "git.example.com", 22), ("93.184.216.34",)).environment(
        {"GIT_SSH_COMMAND": "ssh -i k"}
    )
    assert ssh["GIT_SSH_COMMAND"] == "ssh -i k -o HostName=93.184.216.34 -o HostKeyAlias=git.example.com"
    assert ssh["GIT_ALLOW_PROTOCOL"] == "ssh"
