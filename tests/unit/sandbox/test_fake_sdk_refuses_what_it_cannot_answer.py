"""The fake SDK answers only what it can answer honestly: what it cannot run (another program,
a pipeline, a subshell, globbing, the kernel's files) is refused with an error naming it, never
answered with a guess, so a test that meets it fails instead of passing on a made-up answer.
The conformance suite vouches for what it does answer (``test_fake_sdk_conformance.py``)."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.fake_sky import CannotAnswer, FakeSky, NotFound
from tests.unit.fake_sky.fixtures import FAKE_IMAGE, fake_cloud

__all__ = ["fake_cloud"]


async def _run(cloud: FakeSky, *argv: str, **kwargs: object) -> tuple[int, str, str]:
    sandbox = cloud.sandboxes.get("probe") or await cloud.create.aio(name="probe", image=FAKE_IMAGE)
    handle = await sandbox.exec.aio(*argv, **kwargs)
    code = await handle.wait()
    return code, handle.stdout.read(), handle.stderr.read()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["python3", "-c", "print(1)"], "'python3'"),
        (["sh", "-c", "echo a | tr a b"], "pipeline"),
        (["sh", "-c", "sleep 1 &"], "background"),
        (["sh", "-c", "echo $(id -u)"], "command substitution"),
        (["sh", "-c", "(cd /tmp)"], "subshell"),
        (["sh", "-c", "ls /tmp/*"], "globbing"),
        (["sh", "-c", "if true; then echo y; fi"], "'if'"),
        (["cat", "/proc/self/status"], "no kernel"),
        (["su", "-s", "/bin/bash", "agent", "-c", "id"], "'su'"),
        (["echo", "a\\nb"], "echo"),
        (["tar", "-xf", "-"], "tar"),
    ],
)
async def test_what_it_cannot_run_is_refused_by_name(fake_cloud: FakeSky, argv: list[str], named: str) -> None:
    with pytest.raises(CannotAnswer, match=named):
        await _run(fake_cloud, *argv)


async def test_a_refused_script_runs_none_of_its_commands(fake_cloud: FakeSky) -> None:
    with pytest.raises(CannotAnswer):
        await _run(fake_cloud, "sh", "-c", "mkdir /tmp/made; echo a | cat")
    assert fake_cloud.sandboxes["probe"].tree.get("/tmp/made") is None


async def test_what_it_answers_it_answers_as_sh_does(fake_cloud: FakeSky) -> None:
    script = 'X="a b"; printf "[%s]" $X "$X" "${UNSET-dflt}"; false || echo "rc=$?" >&2; cd /tmp && pwd'
    assert await _run(fake_cloud, "sh", "-c", script) == (0, "[a][b][a b][dflt]/tmp\n", "rc=1\n")
    assert (await _run(fake_cloud, "/no/such/program"))[0] == 127  # a path not in its tree
    assert (await _run(fake_cloud, "sleep", "5", timeout_seconds=0.05))[0] == 124


async def test_a_sandbox_lost_mid_command_ends_the_command_and_stays_listed_as_told(fake_cloud: FakeSky) -> None:
    sandbox = await fake_cloud.create.aio(name="evicted", image=FAKE_IMAGE)
    fake_cloud.faults.lose_on("evicted", "sleep", status="FAILED", message="evicted")
    handle = await sandbox.exec.aio("sleep", "30")
    with pytest.raises(NotFound):
        await asyncio.wait_for(handle.wait(), 1)
    (record,) = await fake_cloud.ls.aio()
    assert (record.name, record.status, record.status_message) == ("evicted", "FAILED", "evicted")
    with pytest.raises(NotFound):
        await sandbox.exec.aio("true")


def test_the_blocking_twins_work_from_a_thread_without_a_loop(fake_cloud: FakeSky) -> None:
    sandbox = fake_cloud.create(name="blocking", image=FAKE_IMAGE)
    sandbox.write_bytes(b"data", "/tmp/f")
    handle = sandbox.exec("cat", "/tmp/f")
    assert (handle.wait(), handle.stdout.read()) == (0, "data")
    sandbox.terminate(wait=True)
    assert [c.call for c in fake_cloud.calls] == ["create", "write_bytes", "exec", "terminate"]


async def test_a_slow_api_delays_every_exec_by_what_was_asked(fake_cloud: FakeSky) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await _run(fake_cloud, "true")
    fast = loop.time() - started
    fake_cloud.faults.slow_exec(0.2)
    started = loop.time()
    assert (await _run(fake_cloud, "true"))[0] == 0
    assert loop.time() - started >= 0.2 > fast
