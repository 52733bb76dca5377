"""Trees in and out of a real sandbox on the default route (archives made of the SDK's own calls):
missing paths read as missing, hostile trees refused on the host; and Harbor's own path with
archives off."""

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
from osmosis_harbor.sandbox.environment.sandbox_environment import REMOVE_REWARDS_COMMAND
from osmosis_harbor.shim import contract
from tests.support.common import started_environment


@pytest.fixture
def calls(sdk_calls: Counter[str]) -> Counter[str]:
    return sdk_calls


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SandboxEnvironment]:
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
