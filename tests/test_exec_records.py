"""An exec whose result read fails is read again from its record in the sandbox, never re-run
(``sandbox/environment/exec_records.py``), on the skypilot-emulator with faults injected by its server.

The fault is aimed at exactly one exec: the test wraps the emulator SDK's exec launch and, once
the server accepted the command (its exec id known), queues a reset or a 503 on that exec's
result read (``GET /execs/{id}``). The emulator SDK's own retries are off (as in
``test_api_faults.py``), so the read really fails; the positive control shows the same fault
loses the sandbox without records. The command appends to a file: it ran exactly once. Through
the real server, a reset on the workflow's own result read costs a rollout no attempt
(``tests/test_lost_in_harbor_transfers.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from osmosis_harbor.errors import SandboxLostError
from osmosis_harbor.sandbox.emulator.client import handles
from osmosis_harbor.sandbox.environment.exec_records import RECORDS_DIR, parse_status

from .emulator_support import EmulatorServer, push_to_local_registry
from .ledger_support import environment_for

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
    env = environment_for("skypilot-emulator", tmp_path, push_to_local_registry(sandbox_image))
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
            # the host held the result: the next exec removed its record
            listing = await env.exec(f"ls {RECORDS_DIR} | grep -c {hit[0]} || true")
            assert listing.stdout == "0\n"

        # where no record can be made, the command still runs as it would unrecorded
        await env.exec(f"rm -rf {RECORDS_DIR} && touch {RECORDS_DIR}")
        unrecorded = await env.exec("echo plain; exit 5")
        assert (unrecorded.return_code, unrecorded.stdout) == (5, "plain\n")

        hit = fault_on_result_read(monkeypatch, emulator_server, "reset", lambda arg: MARK in arg)
        env._records_exec_results = False  # positive control: the same fault, without records
        with pytest.raises(SandboxLostError, match="API failed mid-call"):
            await env.exec(COMMAND)
        assert len(hit) == 1
    finally:
        await env.stop(delete=True)


@pytest.mark.parametrize(
    ("data", "status"),
    [(b"0\n", 0), (b"3\n", 3), (b"255\n", 255), (b"256\n", None), (b"-1\n", None), (b"x\n", None), (b"1" * 9, None)],
)
def test_a_records_status_is_sandbox_output_and_is_checked(data: bytes, status: int | None) -> None:
    assert parse_status(data) == status
