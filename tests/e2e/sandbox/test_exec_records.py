"""An exec whose result read fails is read again from its record in the sandbox, never re-run,
and an exec whose launch's answer is lost is launched again under the same record, which runs
the command once (``sandbox/environment/exec_records.py``), on the skypilot-emulator with faults
injected by its server.

The fault is aimed at exactly one exec: the test wraps the emulator SDK's exec launch and, once
the server accepted the command (its exec id known), queues a reset or a 503 on that exec's
result read (``GET /execs/{id}``). The emulator SDK's own retries are off (as in
``test_api_faults.py``), so the read really fails; the positive control shows the same fault
loses the sandbox without records. The command appends to a file: it ran exactly once. Through
the real server, a reset on the workflow's own result read costs a rollout no attempt
(``tests/e2e/lost_sandbox/test_lost_in_verifier_transfers.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from osmosis_harbor.errors import SandboxLostError
from osmosis_harbor.sandbox.emulator.client import handles
from osmosis_harbor.sandbox.environment import exec_records
from osmosis_harbor.sandbox.environment.exec_records import RECORDS_DIR, parse_status
from tests.support.emulator import EmulatorServer, push_to_local_registry
from tests.support.ledger import environment_for

MARK = "exec-records-target"
REAL_START = handles.ExecMethod._start


@pytest.fixture(autouse=True)
def _no_sdk_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_EMULATOR_RETRIES", "0")
    monkeypatch.setenv("OSMOSIS_HARBOR_API_RETRY_MAX_WAIT", "0.2")


def fault_on_result_read(
    monkeypatch: pytest.MonkeyPatch, emulator: EmulatorServer, kind: str, targets: Callable[[str], bool]
) -> list[str]:
    """Queue ``kind`` on the result read of each exec with an argument ``targets`` picks, once
    the server accepted it (its exec id known); returns the exec ids hit."""
    hit: list[str] = []

    def start(self: handles.ExecMethod, argv: tuple[str, ...], *args: Any) -> Any:
        run = REAL_START(self, argv, *args)
        if any(targets(arg) for arg in argv):
            emulator.fault(kind, path=f"/execs/{run._exec_id}", method="GET", count=1)
            hit.append(run._exec_id)
        return run

    monkeypatch.setattr(handles.ExecMethod, "_start", start)
    return hit


COMMAND = f"echo {MARK} >> /tmp/ran; echo out; echo err >&2; exit 3"


async def test_a_fault_on_an_execs_result_read_is_survived_and_the_command_ran_once(
    emulator_server: EmulatorServer, sandbox_image: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = environment_for("skypilot-emulator", tmp_path, push_to_local_registry(sandbox_image), stem="records")
    await env.start(force_build=False)
    try:
        for kind in ("reset", "503"):
            faults = emulator_server.stats()["faults"].get(kind, 0)
            hit = fault_on_result_read(monkeypatch, emulator_server, kind, lambda arg: MARK in arg)
            result = await env.exec(COMMAND)
            assert len(hit) == 1 and emulator_server.stats()["faults"][kind] == faults + 1  # the read failed
            assert (result.return_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
            ran = await env.exec("cat /tmp/ran; rm /tmp/ran")
            assert ran.stdout == f"{MARK}\n", kind  # dispatched once, never again
            # the host held the result: the next exec removed its output, kept its claim
            listing = await env.exec(f"ls {RECORDS_DIR}/*/out | grep -c {hit[0]} || true")
            assert listing.stdout == "0\n"

        # where no record can be made, the command still runs as it would unrecorded
        await env.exec(f"rm -rf {RECORDS_DIR} && touch {RECORDS_DIR}")
        unrecorded = await env.exec("echo plain; exit 5")
        assert (unrecorded.return_code, unrecorded.stdout) == (5, "plain\n")

        hit = fault_on_result_read(monkeypatch, emulator_server, "reset", lambda arg: MARK in arg)
        env._records.enabled = False  # positive control: the same fault, without records
        with pytest.raises(SandboxLostError, match="API failed mid-call"):
            await env.exec(COMMAND)
        assert len(hit) == 1
    finally:
        await env.stop(delete=True)


def fault_on_launch(emulator: EmulatorServer, kind: str, sandbox: str) -> None:
    """``kind`` on the next exec launch in ``sandbox`` (``reset-after``: the command starts and
    the answer is lost; ``reset``: the request never reaches the server)."""
    emulator.fault(kind, path=f"/sandboxes/{sandbox}/exec", method="POST", count=1)


async def test_a_launch_whose_answer_was_lost_runs_its_command_once(
    emulator_server: EmulatorServer, sandbox_image: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started (``reset-after``): the relaunch attaches to the running command's record; never
    started (``reset``): the relaunch runs it. Either way once, with its own result."""
    env = environment_for("skypilot-emulator", tmp_path, push_to_local_registry(sandbox_image), stem="records")
    await env.start(force_build=False)
    try:
        slow = f"sleep 1; {COMMAND}"  # still running when the relaunch arrives
        for kind in ("reset-after", "reset"):
            faults = emulator_server.stats()["faults"].get(kind, 0)
            fault_on_launch(emulator_server, kind, env.sandbox_name)
            result = await env.exec(slow)
            assert emulator_server.stats()["faults"][kind] == faults + 1  # the launch failed
            assert (result.return_code, result.stdout, result.stderr) == (3, "out\n", "err\n"), kind
            ran = await env.exec("cat /tmp/ran; rm /tmp/ran")
            assert ran.stdout == f"{MARK}\n", kind  # ran once, whichever launch ran it

        # a read record's claim outlives its output: a late launch of it attaches, never reruns
        late = await env.exec(f"ls {RECORDS_DIR} | wc -l")
        assert int(late.stdout) >= 2

        # where no record can be made, a relaunch cannot know what ran: the fault stands
        await env.exec(f"rm -rf {RECORDS_DIR} && touch {RECORDS_DIR}")
        fault_on_launch(emulator_server, "reset-after", env.sandbox_name)
        with pytest.raises(SandboxLostError, match="API failed mid-call"):
            await env.exec(COMMAND)
    finally:
        await env.stop(delete=True)


async def test_without_the_records_claim_a_relaunch_runs_the_command_twice(
    emulator_server: EmulatorServer, sandbox_image: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positive control: the same lost answer, with the wrapper's exclusive ``mkdir`` made a
    ``mkdir -p`` (every launch claims), runs the command twice."""
    claimless = exec_records._WRAPPER.replace('mkdir "$d"', 'mkdir -p "$d"')
    assert claimless != exec_records._WRAPPER
    monkeypatch.setattr(exec_records, "_WRAPPER", claimless)
    env = environment_for("skypilot-emulator", tmp_path, push_to_local_registry(sandbox_image), stem="records")
    await env.start(force_build=False)
    try:
        fault_on_launch(emulator_server, "reset-after", env.sandbox_name)
        await env.exec(COMMAND)
        ran = await env.exec("cat /tmp/ran")
        assert ran.stdout == f"{MARK}\n{MARK}\n"
    finally:
        await env.stop(delete=True)


@pytest.mark.parametrize(
    ("data", "status"),
    [(b"0\n", 0), (b"3\n", 3), (b"255\n", 255), (b"256\n", None), (b"-1\n", None), (b"x\n", None), (b"1" * 9, None)],
)
def test_a_records_status_is_sandbox_output_and_is_checked(data: bytes, status: int | None) -> None:
    assert parse_status(data) == status
