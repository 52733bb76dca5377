"""Every command exits 130 on Ctrl-C (README, "The command line"), with one line and no sandbox left.

A real SIGINT reaches ``rollout`` while its workflow runs in a sandbox (the command's own
osmosis server is in the same process) and ``sandbox-check`` while its sandboxes run;
``validate``'s is in ``tests/e2e/cli/test_validate.py``. For the rest of the commands, which hold
no sandbox at any moment a test could wait for, the interrupt is raised inside the
command's own function through ``main``, as Python raises it on SIGINT.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_harbor import cli
from osmosis_harbor.cli import bundle as bundle_cli
from tests.support.common import FIXTURES, REPO, TASKS, managed_containers, wait_until

COMMANDS = {
    "validate": ["validate", str(TASKS)],
    "prewarm": ["prewarm", str(TASKS / "template")],
    "rollout": ["rollout", str(TASKS / "template"), "--prompt", "hi"],
    "cleanup": ["cleanup", "--pool", "none"],
    "sandbox-check": ["sandbox-check"],
    "bundle": ["bundle", str(FIXTURES / "rollout_project")],
}
FUNCTIONS = {
    "validate": "cmd_validate",
    "prewarm": "cmd_prewarm",
    "rollout": "cmd_rollout",
    "cleanup": "cmd_cleanup",
    "sandbox-check": "cmd_sandbox_check",
}


def _interrupted(*_args: object, **_kwargs: object) -> int:
    raise KeyboardInterrupt


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_maps_ctrl_c_to_130(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == "bundle":
        monkeypatch.setattr(bundle_cli, "cli_main", _interrupted)
    else:
        monkeypatch.setattr(cli, FUNCTIONS[command], _interrupted)
    assert cli.main(COMMANDS[command]) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted") and "Traceback" not in err


def _sigint_when_sandboxes_run(argv: list[str], tmp_path: Path, bundles: Path, count: int = 1) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "osmosis_harbor", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={  # TMPDIR: an interrupted rollout's trial is retained for inspection, under the test's dir
            **__import__("os").environ,
            "HOME": str(tmp_path),
            "OSMOSIS_HARBOR_BUNDLES": str(bundles),  # the session's cache: a bundle is not what is tested
            "TMPDIR": str(tmp_path),
        },
    )
    try:
        wait_until(
            lambda: len(managed_containers(owner_pid=proc.pid)) >= count, timeout=300, what=f"{argv[0]}'s sandbox"
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert managed_containers(owner_pid=proc.pid) == [], f"{argv[0]} left sandboxes behind"
    return proc.returncode, err


@pytest.mark.slow
def test_ctrl_c_stops_a_rollout_with_its_sandbox(tmp_path: Path, bundles_dir: Path) -> None:
    code, err = _sigint_when_sandboxes_run(
        [
            "rollout",
            str(TASKS / "template"),
            "--code-dir",
            str(FIXTURES / "rollout_project"),
            "--workflow",
            "rollout_fixtures.workflows:SleepyWorkflow",
            "--prompt",
            "sleep",
            "--scripted-reply",
            "unused",
            "--no-grade",
        ],
        tmp_path,
        bundles_dir,
    )
    assert code == 130, err
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_stops_sandbox_check_with_its_sandboxes(tmp_path: Path, bundles_dir: Path) -> None:
    code, err = _sigint_when_sandboxes_run(["sandbox-check", "--no-pools"], tmp_path, bundles_dir)
    assert code == 130, err
    assert "interrupted" in err and "Traceback" not in err
