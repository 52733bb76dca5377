"""Archives made of SkyPilot's own calls (``sandbox/transfer/exec_archives.py``), on a real sandbox.

A real Docker sandbox on the default route, SkyPilot's (every SDK's): every tree moves as one tar through a file write or read plus one
command. SDK calls are counted, so each claim about round trips is checked against what the
sandbox was really asked. The graded rollout's call budget on this path is
``tests/e2e/backend/test_baked_bundle.py``; the key end-to-end tests run it on the emulator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from osmosis_harbor.errors import TransferLimitError
from osmosis_harbor.sandbox import SandboxEnvironment
from tests.support.common import made_environment, make_task, started_environment

pytestmark = pytest.mark.slow


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SandboxEnvironment]:
    async with started_environment(tmp_path, "execarch") as environment:
        yield environment


def _tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "data.txt").write_text("payload\n")
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "run.sh").chmod(0o755)
    (root / "sub" / "deeper" / "empty").mkdir()
    return root


async def test_uploads_ride_one_write_and_one_command_with_modes_and_owner(
    env: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    source = _tree(tmp_path / "up")
    await env.upload_dir(source, "/work/a")
    await env.upload_dir(source, "/work/b")
    await env.upload_file(source / "run.sh", "/work/c/run.sh")
    assert sdk_calls["write_bytes"] == sdk_calls["exec"] == 0  # written behind: nothing sent yet
    listing = await env.exec(
        "cd /work && /work/a/run.sh && stat -c '%n %U %a' a/run.sh b/sub/data.txt c/run.sh a/sub/deeper/empty"
        " && cat b/sub/data.txt",
        user="root",
    )
    assert listing.return_code == 0, listing.stderr
    assert listing.stdout.splitlines() == [
        "ran",
        "a/run.sh root 755",
        "b/sub/data.txt root 644",
        "c/run.sh root 755",
        "a/sub/deeper/empty root 755",
        "payload",
    ]
    # three uploads: one write and one unpack command, then the command itself
    assert (sdk_calls["write_bytes"], sdk_calls["exec"], sdk_calls["read_bytes"]) == (1, 2, 0)
    leftovers = await env.exec("ls -A /tmp", user="root")
    assert "osmosis-put-" not in leftovers.stdout  # the unpack command removed its archive


async def test_a_fetch_is_one_command_and_one_read_and_shared_under_logs(
    env: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    made = await env.exec(
        "mkdir -p /logs/agent /logs/artifacts/x && echo hi > /logs/agent/out.txt && echo a > /logs/artifacts/x/f"
        " && ln -s /etc /logs/agent/etc-link",
        user="root",
    )
    assert made.return_code == 0, made.stderr
    before = dict(sdk_calls)
    await env.download_dir("/logs/agent", tmp_path / "agent")
    assert await env.is_dir("/logs/artifacts")
    await env.download_dir("/logs/artifacts", tmp_path / "artifacts")
    assert not await env.is_dir("/logs/nowhere")
    assert (tmp_path / "agent" / "out.txt").read_text() == "hi\n"
    assert (tmp_path / "artifacts" / "x" / "f").read_text() == "a\n"
    assert not (tmp_path / "agent" / "etc-link").exists()  # a link from the sandbox is not planted on the host
    assert sdk_calls["exec"] - before["exec"] == 1 and sdk_calls["read_bytes"] == 1  # one snapshot of /logs
    kept = await env.exec("ls -A /tmp", user="root")
    assert "osmosis-get-" in kept.stdout  # a fetched archive stays until the next archive command...
    # a path that is not there is FileNotFoundError, as the Docker SDK's archive answers
    with pytest.raises(FileNotFoundError):
        await env.download_dir("/nowhere/at/all", tmp_path / "none")
    leftovers = await env.exec("ls -A /tmp", user="root")
    assert "osmosis-get-" not in leftovers.stdout  # ...which removes it


MAKE_BIG_AND_BOMB = (
    "mkdir -p /work/big /work/bomb && head -c 300000 /dev/urandom > /work/big/blob"
    " && head -c 3000000 /dev/zero > /work/bomb/zeros"
)


async def test_an_archive_over_the_bound_is_refused_before_it_is_read_or_while_it_unzips(
    tmp_path: Path, sdk_calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An environment reads its bounds when it is made: each is set before its environment.
    monkeypatch.setenv("OSMOSIS_HARBOR_TRANSFER_MAX_BYTES", "100000")
    monkeypatch.setenv("OSMOSIS_HARBOR_TRANSFER_MAX_FILES", "10")
    async with started_environment(tmp_path / "bounded", "execarch") as env:
        made = await env.exec(MAKE_BIG_AND_BOMB, user="root")
        assert made.return_code == 0, made.stderr
        sdk_calls.clear()
        with pytest.raises(TransferLimitError, match="OSMOSIS_HARBOR_TRANSFER_MAX_BYTES"):
            await env.download_dir("/work/big", tmp_path / "big")
        assert sdk_calls["read_bytes"] == 0  # the size the pack command printed was enough to refuse it
        # zeros gzip to a few KiB: read, then refused as the tar unzips past the bound
        with pytest.raises(TransferLimitError, match="OSMOSIS_HARBOR_TRANSFER_MAX_BYTES"):
            await env.download_dir("/work/bomb", tmp_path / "bomb")
        assert sdk_calls["read_bytes"] == 1 and not (tmp_path / "bomb" / "zeros").exists()
    monkeypatch.setenv("OSMOSIS_HARBOR_TRANSFER_MAX_BYTES", "4000000")
    async with started_environment(tmp_path / "wide", "execarch") as env:  # positive control: within the bound
        made = await env.exec(MAKE_BIG_AND_BOMB, user="root")
        assert made.return_code == 0, made.stderr
        await env.download_dir("/work/big", tmp_path / "big")  # both arrive
        await env.download_dir("/work/bomb", tmp_path / "bomb")
    assert (tmp_path / "big" / "blob").stat().st_size == 300000
    assert (tmp_path / "bomb" / "zeros").stat().st_size == 3000000


@pytest.fixture
async def env_with_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SandboxEnvironment]:
    """A sandbox whose task declares ``/work`` and ``/absent`` as artifacts (Harbor downloads them
    after the agent's run)."""
    task = make_task(tmp_path / "ds", "execarch-artifacts", dockerfile="FROM debian:trixie-slim\nWORKDIR /work\n")
    toml = task / "task.toml"
    toml.write_text('artifacts = ["/work", "/absent", "/logs/artifacts"]\n' + toml.read_text())
    environment = made_environment(task, tmp_path / "trial", "execarch-artifacts")
    await environment.start(force_build=False)
    try:
        yield environment
    finally:
        await environment.stop(delete=True)


async def test_the_agents_declared_artifacts_come_in_the_same_fetch_as_its_logs(
    env_with_artifacts: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    env = env_with_artifacts
    made = await env.exec(
        "mkdir -p /logs/agent && echo hi > /logs/agent/out.txt && echo w > /work/made.txt", user="root"
    )
    assert made.return_code == 0, made.stderr
    before = dict(sdk_calls)
    await env.download_dir("/logs/agent", tmp_path / "agent")
    assert await env.is_dir("/work") and not await env.is_dir("/absent")
    await env.download_dir("/work", tmp_path / "work")
    with pytest.raises(FileNotFoundError):
        await env.download_dir("/absent", tmp_path / "absent")
    assert (tmp_path / "agent" / "out.txt").read_text() == "hi\n"
    assert (tmp_path / "work" / "made.txt").read_text() == "w\n"
    # one pack command and one read for all three (the missing one known absent from it)
    assert (sdk_calls["exec"] - before["exec"], sdk_calls["read_bytes"] - before.get("read_bytes", 0)) == (1, 1)
    # a command may change anything: the next read fetches again
    await env.exec("echo again > /work/made.txt", user="root")
    await env.download_dir("/work", tmp_path / "work2")
    assert (tmp_path / "work2" / "made.txt").read_text() == "again\n"


async def test_harbors_emptying_of_an_upload_target_rides_the_upload(
    env: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    """``empty_dirs`` costs no call of its own: it runs with the next upload's unpack, before it,
    as Harbor's artifact copy expects (the target holds only what was uploaded)."""
    made = await env.exec("mkdir -p /work/art && echo stale > /work/art/old.txt", user="root")
    assert made.return_code == 0, made.stderr
    before = dict(sdk_calls)
    emptied = await env.empty_dirs(["/work/art"], chmod=True)
    assert emptied is not None and emptied.return_code == 0
    assert sdk_calls["exec"] == before["exec"]  # staged, not run
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "new.txt").write_text("fresh\n")
    await env.upload_dir(tmp_path / "up", "/work/art")
    listing = await env.exec("ls -A /work/art && stat -c %a /work/art", user="root")
    assert listing.stdout.split() == ["new.txt", "777"], listing.stdout
    # the write, the emptying and unpack in one command, then the listing itself
    assert (sdk_calls["write_bytes"] - before.get("write_bytes", 0), sdk_calls["exec"] - before["exec"]) == (1, 2)
    assert not await env.is_file("/work/art/old.txt")


async def test_a_staged_emptying_that_fails_fails_the_next_command_by_name(env: SandboxEnvironment) -> None:
    made = await env.exec("echo file > /work/plain", user="root")
    assert made.return_code == 0, made.stderr
    await env.empty_dirs(["/work/plain/below"], chmod=True)  # mkdir -p under a file cannot succeed
    with pytest.raises(RuntimeError, match=r"Failed to prepare and unpack an upload into '/' in the sandbox"):
        await env.exec("true", user="root")
    ran = await env.exec("cat /work/plain", user="root")  # once reported, it is not run again
    assert ran.return_code == 0 and ran.stdout == "file\n"
