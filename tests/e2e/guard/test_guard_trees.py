"""Where an SDK's exec runs a shell, a root agent whose tests share its sandbox is refused by
default: a shell planted first on PATH would run first, unmarked, in every later exec. The refusal
follows the SDK's registration, the agent's user and the explicit opt-in, and ``validate``'s lint
lists the tasks training refuses. The rollouts that show it (refused on the emulator, run on
docker; opted in, the planted shell pays on the emulator and is caught on docker) and the guard's
whole-tree attacks with their positive controls run in ``test_verifier_guard.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox.sdk.registry import implementation
from osmosis_harbor.tasks.discovery import discover_tasks
from osmosis_harbor.tasks.verifier_shell import OPT_IN, RULE, shell_exec_refusal
from osmosis_harbor.validate.lint import LintMode, lint_dataset
from tests.e2e.guard.test_verifier_guard import DATASET
from tests.support.sdk_paths import EMULATOR

OPT_IN_VAR = OPT_IN.split("=")[0]


# ── the refusal's decision and validate's lint, without sandboxes ─────────────────────────────


def _task(tmp_path: Path, agent: str = "") -> Path:
    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    (task / "instruction.md").write_text("Do it.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text(
        f'schema_version = "1.1"\n\n[agent]\ntimeout_sec = 60.0\n{agent}\n'
        '[verifier]\ntimeout_sec = 60.0\nenvironment_mode = "shared"\n'
    )
    return task


@pytest.mark.parametrize(
    ("sdk", "agent", "opted_in", "refused"),
    [
        ("skypilot-emulator", "", False, True),
        ("skypilot", 'user = "root"', False, True),
        ("skypilot-emulator", 'user = "agent"', False, False),
        ("skypilot-emulator", "", True, False),
        ("docker", "", False, False),
    ],
)
def test_the_refusal_follows_the_sdks_registration_the_agent_user_and_the_opt_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sdk: str, agent: str, opted_in: bool, refused: bool
) -> None:
    if opted_in:
        monkeypatch.setenv(OPT_IN_VAR, "1")
    else:
        monkeypatch.delenv(OPT_IN_VAR, raising=False)
    why = shell_exec_refusal(_task(tmp_path, agent), "t", implementation(sdk), guarded=True, config=settings.current())
    assert (why is not None) is refused, why
    assert (
        shell_exec_refusal(
            _task(tmp_path / "off", ""), "t", implementation(sdk), guarded=False, config=settings.current()
        )
        is None
    )


def test_validate_lint_lists_the_tasks_training_refuses_on_that_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPT_IN_VAR, raising=False)
    tasks = [t for t in discover_tasks(DATASET) if t.id == "sum-42"]
    emulator = lint_dataset(tasks, LintMode.REPORT, settings.current(), implementation(EMULATOR))["sum-42"]
    [issue] = [i for i in emulator if i.rule == RULE]
    assert "training refuses this task" in issue.message and OPT_IN in issue.message and issue.path == "task.toml"
    docker = lint_dataset(tasks, LintMode.REPORT, settings.current(), implementation("docker"))["sum-42"]
    assert not [i for i in docker if i.rule == RULE]
