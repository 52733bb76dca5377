"""A sandbox lost while Harbor's verifier adds the tests directory or downloads the verifier
directory is a lost sandbox, through the real server (docs/operations.md, "Lost sandboxes").

Harbor wraps a failure of either transfer in its own ``AddTestsDirError`` /
``DownloadVerifierDirError`` (the loss being their cause), which alone would read as an
``internal_error`` that ``infra_retries`` does not retry. The test plays the infrastructure at
the very step: when Harbor calls the environment's ``upload_dir`` to the tests directory (or
its ``download_dir`` of ``/logs/verifier``), the emulator is told to evict the sandbox on its
next call (a targeted fault); then the transfer runs. Both transfers are
played at once, one rollout each on one backend, each loss aimed at its rollout's sandbox. With
``infra_retries=1`` each rollout must succeed on a fresh sandbox, its first attempt recorded as
lost, and a spy on the trial results shows Harbor really recorded its wrapper: the loss was
recognised through what the environment saw, not because Harbor named it. Meanwhile the result
read of one workflow's exec is reset once (``sandbox/environment/exec_records.py``): survived
from the exec's record, it costs no attempt and re-runs nothing (one chat call per attempt).

It runs on the emulator only, with archives over commands off (``OSMOSIS_HARBOR_EXEC_ARCHIVES=0``),
where these transfers are Harbor's own (SkyPilot's SDK has no archives). By default both paths
send them as archives, and a sandbox lost in the verifier is ``tests/e2e/lost_sandbox/test_lost_in_agent_or_verifier.py``'s key
test, which runs on both SDKs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harbor.models.trial.result import TrialResult
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import attempts
from osmosis_harbor.sandbox import SandboxEnvironment
from osmosis_harbor.shim import contract
from tests.e2e.sandbox.test_exec_records import fault_on_result_read
from tests.support.common import managed_containers
from tests.support.emulator import EmulatorServer
from tests.support.lost_sandbox import diagnostics, make_backend, start
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import EMULATOR, SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

# (the environment method Harbor's verifier calls, its argument naming the directory, the directory, Harbor's wrapper)
PHASES = {
    "add tests dir": ("upload_dir", "target_dir", "/tests", "AddTestsDirError"),
    "download verifier dir": ("download_dir", "source_dir", "/logs/verifier", "DownloadVerifierDirError"),
}


def lose(sdk: SdkPath, name: str) -> None:
    """The infrastructure takes the sandbox ``name``: evicted by the emulator on its next call."""
    assert sdk.emulator is not None
    sdk.emulator.fault("evict", path=f"/sandboxes/{name}/", count=1)


def lose_at(monkeypatch: pytest.MonkeyPatch, sdk: SdkPath, phase: str, rollout_id: str) -> list[str]:
    """Lose the first sandbox of ``rollout_id`` that reaches ``phase``; returns its name once it happened."""
    method, argument, directory, _ = PHASES[phase]
    real: Callable[..., Any] = getattr(SandboxEnvironment, method)
    signature = inspect.signature(real)
    lost: list[str] = []

    async def losing(self: SandboxEnvironment, *args: Any, **kwargs: Any) -> Any:
        where = signature.bind(self, *args, **kwargs).arguments[argument]
        if not lost and rollout_id in self.sandbox_name and str(where).rstrip("/") == directory:
            lost.append(self.sandbox_name)
            await asyncio.to_thread(lose, sdk, self.sandbox_name)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(SandboxEnvironment, method, losing)
    return lost


def recorded_exceptions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """What Harbor recorded on each trial (its name, the exception's type), before the host read
    it (``backend.losses``)."""
    real = attempts.recognise_loss
    seen: list[tuple[str, str | None]] = []

    def spy(result: TrialResult, losses: Any) -> TrialResult:
        seen.append((result.trial_name, result.exception_info.exception_type if result.exception_info else None))
        return real(result, losses)

    monkeypatch.setattr(attempts, "recognise_loss", spy)
    return seen


async def test_a_sandbox_lost_in_harbors_verifier_transfers_is_retried(
    tmp_path: Path,
    tasks: Path,  # noqa: F811 (the fixture imported above)
    fake_chat,
    osmosis_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    emulator_server: EmulatorServer,
) -> None:
    sandbox_sdk = SdkPath(EMULATOR, emulator_server)
    sandbox_sdk.require_loopback_endpoint()
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    ids = {phase: f"{phase.split()[-2]}-{uuid.uuid4().hex[:6]}" for phase in PHASES}  # tests-…, verifier-…
    lost = {phase: lose_at(monkeypatch, sandbox_sdk, phase, ids[phase]) for phase in PHASES}
    recorded = recorded_exceptions(monkeypatch)
    workflow = f"{contract.VENV}/bin/"  # a workflow's exec: its result read is reset, once
    picked: list[str] = []
    picking = threading.Lock()  # both rollouts' execs start at once, on the SDK's threads

    def first_workflow_exec(arg: str) -> bool:
        with picking:
            if workflow in arg and not picked:
                picked.append(arg)
                return True
            return False

    reset = fault_on_result_read(monkeypatch, emulator_server, "reset", first_workflow_exec)
    resets = emulator_server.stats()["faults"].get("reset", 0)
    backend = make_backend(tmp_path, tasks, sandbox_sdk, infra_retries=1)
    async with serve(backend) as url, client_for(url) as client:
        handles = {
            phase: await start(client, fake_chat, rid, f"reply: echo 42 > answer.txt # {rid}")
            for phase, rid in ids.items()
        }
        results = {phase: await handle.wait_for_completion() for phase, handle in handles.items()}

    assert len(reset) == 1 and emulator_server.stats()["faults"]["reset"] == resets + 1
    for phase, rollout_id in ids.items():
        assert len(lost[phase]) == 1, f"the rollout never reached {phase}"
        result = results[phase]
        assert result.status is RolloutStatus.SUCCESS, (phase, result.err_message)
        assert result.sample.reward == 1.0
        extra = diagnostics(osmosis_home, rollout_id)
        assert extra["attempts"] == 2, (phase, extra)
        (first,) = extra["lost_sandboxes"]
        assert first["error"].startswith(f"sandbox {lost[phase][0]} was lost"), first
        # no archives: Harbor's own transfer failed, and wrapped it
        mine = [kind for trial, kind in recorded if trial.startswith(rollout_id)]
        assert mine[0] == PHASES[phase][3], (phase, recorded)
        # the reset read cost no attempt (with infra_retries=1 it would have ended its rollout),
        # and re-ran nothing: one chat call per attempt (exec_records.py)
        assert len([r for r in fake_chat.requests if rollout_id in json.dumps(r.body)]) == 2
    assert sandbox_sdk.sandboxes_left() == []
    assert managed_containers(owner_pid=os.getpid()) == []
