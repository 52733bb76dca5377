"""Our Harbor environment on the fake SDK, through Harbor's ``BaseEnvironment`` API only (start,
exec, uploads and downloads, stop) and the SDK calls it makes: the call shapes it keeps from
Harbor's ``SkypilotEnvironment``, Harbor's own transfer commands (the route the fake can run),
lost sandboxes and API faults. The default exec-archive route (folded shell scripts the fake does not run) is left to
the end-to-end tests on real sandboxes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from osmosis_harbor.errors import SandboxDiskBoundError, SandboxLostError
from osmosis_harbor.sandbox import SandboxEnvironment
from tests.unit.fake_sky import FakeImage, FakeSky, InvalidRequest
from tests.unit.fake_sky.fixtures import FAKE_IMAGE, fake_cloud, fake_environment, fake_task

__all__ = ["fake_cloud"]

HARBOR_PATH = {"OSMOSIS_HARBOR_EXEC_ARCHIVES": "0"}  # Harbor's write + tar command path
ROUTES = {"harbor_commands": HARBOR_PATH}


@pytest.fixture
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name = getattr(request, "param", "harbor_commands")
    for key, value in ROUTES[name].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OSMOSIS_HARBOR_API_RETRY_MAX_WAIT", "0.01")
    return name


@pytest.fixture
async def started(fake_cloud: FakeSky, route: str, tmp_path: Path) -> AsyncIterator[SandboxEnvironment]:
    fake_cloud.add_image(FAKE_IMAGE, FakeImage(workdir="/work"))
    environment = fake_environment(fake_task(tmp_path, workdir="/work"), tmp_path / "trial")
    await environment.start(force_build=False)
    try:
        yield environment
    finally:
        await environment.stop(delete=True)


def _payload(root: Path) -> Path:
    source = root / "payload"
    (source / "sub").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "sub" / "data.bin").write_bytes(bytes(range(256)) * 40)
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    return source


async def test_start_exec_and_stop_keep_harbors_call_shapes(fake_cloud: FakeSky, tmp_path: Path) -> None:
    environment = fake_environment(fake_task(tmp_path), tmp_path / "trial")
    await environment.start(force_build=False)
    (create,) = fake_cloud.calls_of("create")
    assert create.kwargs["name"] == environment.sandbox_name and create.kwargs["image"] == FAKE_IMAGE
    assert create.kwargs["timeout"] == 86400 and create.kwargs["block_network"] is False
    result = await environment.exec("echo out; echo $GREETING >&2; exit 7", env={"GREETING": "hi"}, timeout_sec=30)
    assert (result.return_code, result.stdout, result.stderr) == (7, "out\n", "hi\n")
    exec_call = fake_cloud.calls_of("exec")[-1]
    assert exec_call.args == ("bash", "-c", "echo out; echo $GREETING >&2; exit 7")
    assert exec_call.kwargs["timeout_seconds"] == 30 and exec_call.kwargs["env"] == {"GREETING": "hi"}
    await environment.exec("true")
    assert fake_cloud.calls_of("exec")[-1].kwargs["timeout_seconds"] == 3600  # SkyPilot's cap, Harbor's default
    await environment.stop(delete=True)
    assert fake_cloud.calls_of("terminate")[-1].kwargs == {"wait": True}
    assert fake_cloud.live() == []


async def test_exec_runs_in_the_tasks_workdir_or_the_cwd_given(started: SandboxEnvironment) -> None:
    assert (await started.exec("pwd")).stdout == "/work\n"
    assert (await started.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await started.exec("echo ${GREETING-unset}")).stdout == "unset\n"  # exec env is not kept


@pytest.mark.parametrize("route", list(ROUTES), indirect=True)
async def test_directories_and_files_round_trip_with_modes_and_empty_dirs(
    started: SandboxEnvironment, route: str, fake_cloud: FakeSky, tmp_path: Path
) -> None:
    source = _payload(tmp_path)
    await started.upload_dir(source, "/work/payload")
    assert (await started.exec("/work/payload/run.sh")).stdout == "ran\n"  # modes survive
    await started.download_dir("/work/payload", tmp_path / "back")
    back = tmp_path / "back"
    assert (back / "sub" / "data.bin").read_bytes() == (source / "sub" / "data.bin").read_bytes()
    assert (back / "empty").is_dir() and (back / "run.sh").stat().st_mode & 0o111
    assert await started.is_dir("/work/payload/sub") and not await started.is_dir("/work/payload/run.sh")
    assert await started.is_file("/work/payload/run.sh") and not await started.is_file("/work/payload/none")
    await started.upload_file(source / "sub" / "data.bin", "/work/one.bin")
    await started.download_file("/work/one.bin", tmp_path / "one.bin")
    assert (tmp_path / "one.bin").read_bytes() == (source / "sub" / "data.bin").read_bytes()
    used = {call.call for call in fake_cloud.calls}
    assert {"write_bytes", "read_bytes"} <= used and not used & {"put_archive", "get_archive"}
    assert any("tar -xzf" in " ".join(c.args) for c in fake_cloud.calls_of("exec"))


async def test_a_missing_file_downloads_as_file_not_found(started: SandboxEnvironment, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await started.download_file("/work/never-written", tmp_path / "x")
    assert not (tmp_path / "x").exists()


async def test_a_link_leaving_the_downloaded_tree_brings_nothing_from_outside(
    started: SandboxEnvironment, fake_cloud: FakeSky, tmp_path: Path
) -> None:
    sandbox = fake_cloud.sandboxes[started.sandbox_name]
    sandbox.tree.mkdir("/work/out")
    sandbox.tree.write("/work/secret", b"outside the tree")
    sandbox.tree.symlink("/work/secret", "/work/out/link")
    # Control: in the sandbox the link does reach the file outside the tree.
    assert (await started.exec("cat /work/out/link")).stdout == "outside the tree"
    try:
        await started.download_dir("/work/out", tmp_path / "out")
    except Exception as refused:  # noqa: BLE001 - a refusal is as good as a skip, if it names the link
        assert "link" in str(refused)
    copied = [p for p in (tmp_path / "out").rglob("*") if p.is_file() and not p.is_symlink()]
    assert all(b"outside the tree" not in p.read_bytes() for p in copied)
    assert not any(p.is_symlink() and not p.resolve().is_relative_to(tmp_path) for p in (tmp_path / "out").rglob("*"))


async def test_a_sandbox_lost_under_a_command_is_a_loss_not_the_commands_failure(
    started: SandboxEnvironment, fake_cloud: FakeSky
) -> None:
    fake_cloud.faults.lose_on(started.sandbox_name, "sleep")
    with pytest.raises(SandboxLostError) as lost:
        await started.exec("sleep 5")
    assert started.sandbox_name in str(lost.value)
    assert fake_cloud.calls_of("ls"), "the environment asked ls() whether the sandbox lives"


async def test_a_command_failing_in_a_live_sandbox_is_its_own_result(started: SandboxEnvironment) -> None:
    result = await started.exec("exit 137")
    assert result.return_code == 137  # the workflow's doing (it may kill itself): no loss


async def test_a_sandbox_evicted_for_its_own_disk_is_the_workflows_error(
    started: SandboxEnvironment, fake_cloud: FakeSky
) -> None:
    message = "Pod ephemeral local storage usage exceeds the total limit of containers 10Gi."
    fake_cloud.faults.lose_on(started.sandbox_name, "sleep", status="FAILED", message=message)
    with pytest.raises(SandboxDiskBoundError):
        await started.exec("sleep 5")


@pytest.mark.parametrize("route", ["harbor_commands"], indirect=True)
async def test_a_file_write_that_met_an_api_fault_is_retried(
    started: SandboxEnvironment, fake_cloud: FakeSky, tmp_path: Path
) -> None:
    source = tmp_path / "one.txt"
    source.write_text("payload")
    fake_cloud.faults.fail("write_bytes", times=1)
    await started.upload_file(source, "/work/one.txt")
    assert (await started.exec("cat /work/one.txt")).stdout == "payload"
    assert len(fake_cloud.calls_of("write_bytes")) == 2


async def test_a_refused_create_fails_the_start_and_leaves_nothing(fake_cloud: FakeSky, tmp_path: Path) -> None:
    environment = fake_environment(fake_task(tmp_path), tmp_path / "trial")
    fake_cloud.faults.fail("create", InvalidRequest("the image is not allowed here"))
    with pytest.raises(Exception, match="not allowed"):
        await environment.start(force_build=False)
    await environment.stop(delete=True)
    assert fake_cloud.live() == [] and len(fake_cloud.calls_of("create")) == 1  # a refusal is not retried
