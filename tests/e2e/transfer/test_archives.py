"""Trees in and out of a real sandbox over the archive capability (``sandbox/transfer/archives.py``,
taken with ``OSMOSIS_HARBOR_SDK_ARCHIVE_CALLS=1``):
one call each way, uploads written behind, log-tree reads served from one snapshot, hostile
archives refused on the host, and Harbor's own path when a handle lacks the capability."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from harbor.models.task.config import TaskOS
from harbor.models.trial.paths import EnvironmentPaths
from harbor.utils.scripts import quote_shell_arg

from osmosis_harbor.sandbox import SandboxEnvironment
from osmosis_harbor.sandbox.environment import routes as environment_routes
from osmosis_harbor.sandbox.environment.sandbox_environment import REMOVE_REWARDS_COMMAND
from osmosis_harbor.shim import contract
from tests.support.common import started_environment


@pytest.fixture
def calls(sdk_calls: Counter[str]) -> Counter[str]:
    return sdk_calls


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SandboxEnvironment]:
    monkeypatch.setenv("OSMOSIS_HARBOR_SDK_ARCHIVE_CALLS", "1")  # this module's route (SkyPilot's is the default)
    async with started_environment(tmp_path, "xfer") as environment:
        yield environment


def _tree(root: Path) -> Path:
    (root / "sub" / "empty").mkdir(parents=True)
    (root / "sub" / "data.bin").write_bytes(bytes(range(256)) * 50)
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("sub/data.bin")
    return root


def _listing(root: Path) -> Iterator[tuple[str, str, int]]:
    for path in sorted(root.rglob("*")):
        kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
        yield str(path.relative_to(root)), kind, path.lstat().st_mode & 0o777 if kind != "link" else 0


async def test_a_tree_goes_up_and_comes_back_in_one_call_each_way(
    env: SandboxEnvironment, tmp_path: Path, calls: Counter[str]
) -> None:
    src = _tree(tmp_path / "src")
    await env.upload_dir(src, "/work/payload")
    assert calls["put_archive"] == 0  # staged, not sent yet
    ran = await env.exec("/work/payload/run.sh && readlink /work/payload/link && test -d /work/payload/sub/empty")
    assert (ran.return_code, ran.stdout) == (0, "ran\nsub/data.bin\n")
    assert calls["put_archive"] == 1
    owner = await env.exec("stat -c '%U %a' /work/payload/run.sh /work/payload")
    assert owner.stdout.splitlines()[0] == "root 755"
    await env.download_dir("/work/payload", tmp_path / "back")
    assert calls["get_archive"] == 1
    assert list(_listing(tmp_path / "back")) == list(_listing(src))
    assert (tmp_path / "back" / "sub" / "data.bin").read_bytes() == bytes(range(256)) * 50
    assert calls["write_bytes"] == calls["read_bytes"] == 0


async def test_staged_uploads_go_in_one_call_before_the_next_command(
    env: SandboxEnvironment, tmp_path: Path, calls: Counter[str]
) -> None:
    src = _tree(tmp_path / "src")
    (tmp_path / "one.txt").write_text("one\n")
    await env.upload_dir(src, "/work/a")
    await env.upload_file(tmp_path / "one.txt", "/opt/new/deep/one.txt")
    await env.upload_dir(src, "/work/b")
    (src / "sub" / "data.bin").write_text("changed after staging")  # the staged copy is what goes
    before = calls["exec"]
    result = await env.exec(
        "cat /opt/new/deep/one.txt && cmp -s /work/a/sub/data.bin /work/b/sub/data.bin && echo same"
    )
    assert (result.return_code, result.stdout) == (0, "one\nsame\n")
    assert calls["put_archive"] == 1 and calls["exec"] == before + 1
    size = await env.exec("stat -c %s /work/b/sub/data.bin")
    assert size.stdout.strip() == str(256 * 50)


async def test_a_read_of_a_staged_upload_sends_it_first(
    env: SandboxEnvironment, tmp_path: Path, calls: Counter[str]
) -> None:
    (tmp_path / "one.bin").write_bytes(b"\x00one")
    await env.upload_file(tmp_path / "one.bin", "/work/one.bin")
    assert await env.is_file("/work/one.bin")
    await env.download_file("/work/one.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == b"\x00one"
    assert calls["put_archive"] == 1 and calls["get_archive"] == 1


async def test_uploads_nobody_could_observe_are_never_sent(
    env: SandboxEnvironment, tmp_path: Path, calls: Counter[str]
) -> None:
    await env.upload_dir(_tree(tmp_path / "src"), "/logs/agent")
    await env.stop(delete=True)
    assert calls["put_archive"] == 0


async def test_log_tree_reads_share_one_snapshot_until_something_changes(
    env: SandboxEnvironment, tmp_path: Path, calls: Counter[str]
) -> None:
    made = await env.exec(
        "mkdir -p /logs/agent /logs/artifacts/out && echo a > /logs/agent/a.txt && echo b > /logs/artifacts/out/b.txt"
    )
    assert made.return_code == 0
    await env.download_dir("/logs/agent", tmp_path / "agent")
    (tmp_path / "agent" / "host-made.log").write_text("written on the host\n")
    await env.upload_dir(tmp_path / "agent", "/logs/agent")  # Harbor sends agent logs back up
    assert await env.is_dir("/logs/artifacts") and not await env.is_file("/logs/artifacts")
    assert await env.is_file("/logs/artifacts/out/b.txt")
    await env.download_dir("/logs/artifacts", tmp_path / "artifacts")
    assert calls["get_archive"] == 1 and calls["put_archive"] == 0
    assert (tmp_path / "agent" / "a.txt").read_text() == "a\n"
    assert (tmp_path / "artifacts" / "out" / "b.txt").read_text() == "b\n"
    # a read of what was uploaded is answered with the upload laid over the snapshot
    await env.download_dir("/logs/agent", tmp_path / "again")
    assert calls["put_archive"] == 0 and calls["get_archive"] == 1
    assert (tmp_path / "again" / "host-made.log").read_text() == "written on the host\n"
    assert (tmp_path / "again" / "a.txt").read_text() == "a\n"
    # a command sees the upload, and invalidates the snapshot: what it wrote is seen
    seen = await env.exec("cat /logs/agent/host-made.log && echo c > /logs/artifacts/out/c.txt")
    assert seen.stdout == "written on the host\n" and calls["put_archive"] == 1
    await env.download_file("/logs/artifacts/out/c.txt", tmp_path / "c.txt")
    assert (tmp_path / "c.txt").read_text() == "c\n" and calls["get_archive"] == 2


async def test_missing_paths_read_as_missing(env: SandboxEnvironment, tmp_path: Path) -> None:
    assert not await env.is_dir("/no/such/dir") and not await env.is_file("/no/such/file")
    assert not await env.is_dir("/logs/none")  # under /logs, with no /logs at all
    with pytest.raises(FileNotFoundError):
        await env.download_dir("/no/such/dir", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        await env.download_file("/logs/agent/none.txt", tmp_path / "x.txt")
    await env.exec("mkdir -p /logs/agent && echo f > /logs/agent/f")
    with pytest.raises(NotADirectoryError):
        await env.download_dir("/logs/agent/f", tmp_path / "y")


async def test_a_hostile_sandbox_cannot_write_outside_the_target(env: SandboxEnvironment, tmp_path: Path) -> None:
    """Links out of the tree and a directory replaced by a link are refused on the host."""
    planted = await env.exec(
        "mkdir -p /logs/agent && ln -s /etc/passwd /logs/agent/passwd && ln -s ../../../../../../tmp /logs/agent/up "
        "&& echo ok > /logs/agent/ok.txt && ln -s /etc /logs/artifacts"
    )
    assert planted.return_code == 0
    target = tmp_path / "t" / "agent"
    await env.download_dir("/logs/agent", target)
    assert (target / "ok.txt").read_text() == "ok\n"
    assert not (target / "passwd").exists() and not (target / "up").exists()
    assert not await env.is_dir("/logs/artifacts")  # a link, not followed
    with pytest.raises(NotADirectoryError):
        await env.download_dir("/logs/artifacts", tmp_path / "t" / "artifacts")
    assert sorted(os.listdir(tmp_path / "t")) == ["agent"]


async def test_without_the_capability_harbors_own_path_runs(
    tmp_path: Path, calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment_routes, "has_archives", lambda _sandbox: False)
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")  # not archives made of commands either (read at init)
    async with started_environment(tmp_path, "harbor-path") as env:
        src = _tree(tmp_path / "src")
        await env.upload_dir(src, "/work/payload")
        assert calls["write_bytes"] == 1  # sent at once, through Harbor's write + unpack
        await env.download_dir("/work/payload", tmp_path / "back")
        assert list(_listing(tmp_path / "back")) == list(_listing(src))
        assert calls["put_archive"] == calls["get_archive"] == 0 and calls["read_bytes"] == 1
        assert await env.is_dir("/work/payload/sub")


def test_the_fresh_sandbox_layout_is_harbors() -> None:
    """What a fresh baked sandbox is assumed to hold, and the reward-clearing command skipped
    there, are Harbor's own paths and command: they cannot drift apart silently."""
    paths = EnvironmentPaths()
    assert contract.LAYOUT_DIRS == (str(paths.agent_dir), str(paths.verifier_dir), str(paths.artifacts_dir))
    rewards = (paths.reward_text_path, paths.reward_json_path)
    assert REMOVE_REWARDS_COMMAND == "rm -f -- " + " ".join(quote_shell_arg(p, TaskOS.LINUX) for p in rewards)
