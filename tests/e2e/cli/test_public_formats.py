"""Task formats from the wild (multi-step, multi-key rewards, compose) judged right by
``validate`` under both agents, through real trials; and the verdict rules on their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_harbor.trials.reading import StepReading, TrialPhase, TrialReading
from osmosis_harbor.trials.verdict import judge, reward_shortfall
from tests.support.common import FIXTURES, load_json, managed_containers, orphaned_containers, run_cli
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

PUBLIC = FIXTURES / "public-formats"
IDS = [
    "multi-step-pass",
    "multi-step-failing",
    "multi-key-full",
    "multi-key-partial",
    "compose-sidecar",
    "compose-only",
]
COMPOSE_ERROR = "multi-container tasks (environment/docker-compose.yaml) are not supported by sandbox environments"


def _validate(tmp_path: Path, agent: str, sdk: SdkPath) -> tuple[dict[str, dict], str]:
    report = tmp_path / f"{agent}.json"
    selection = [arg for task_id in IDS for arg in ("--task", task_id)]
    before = {c["Id"] for c in managed_containers()}
    routes = sdk.routes()
    proc = run_cli(
        *("validate", str(PUBLIC), "--env", sdk.name, "--agent", agent, "-n", "3", "--json", str(report), *selection),
        env={"COLUMNS": "400", **sdk.cli_env()},
    )  # wide enough that no cell wraps
    assert proc.returncode == 1, proc.stdout + proc.stderr  # compose tasks always fail
    assert not orphaned_containers(before, proc.pid), "validate left sandboxes behind"
    assert not sdk.sandboxes_left(), "validate left emulator sandboxes behind"
    sdk.assert_harbors_transfer_path(routes)  # on the emulator: no archive calls; file writes, reads and execs
    return {row["id"]: row for row in load_json(report)["tasks"]}, proc.stdout


@pytest.mark.slow
def test_oracle_verdicts_on_public_task_formats(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    rows, table = _validate(tmp_path, "oracle", sandbox_sdk)
    assert {k: v["passed"] for k, v in rows.items()} == {
        "multi-step-pass": True,
        "multi-step-failing": False,
        "multi-key-full": True,
        "multi-key-partial": False,
        "compose-sidecar": False,
        "compose-only": False,
    }
    ok = rows["multi-step-pass"]
    assert [(s["name"], s["ran"], s["passed"], s["reward"]) for s in ok["steps"]] == [
        ("init", True, True, 1.0),
        ("extend", True, True, 1.0),
        ("report", True, True, 1.0),
    ]
    assert all({"agent", "verifier"} <= set(s["timings_sec"]) for s in ok["steps"])

    bad = rows["multi-step-failing"]
    summary, *details = bad["error"].split("\n")
    assert summary == "step implement: solve.sh exited with status 3; step document: reward 0.5 (expected 1)"
    assert details == ["--- step implement: solve.sh output (last lines) ---", "implement: giving up on purpose"]
    assert bad["steps"][1]["error"] == "\n".join(["solve.sh exited with status 3", *details])  # the step's own
    assert bad["failed_phase"] == "agent"
    assert bad["reward"] == 0.5  # Harbor's "final" strategy: the last step's reward, reported not judged
    steps = {s["name"]: s for s in bad["steps"]}
    assert steps["prepare"]["passed"] and steps["implement"]["reward"] == 1.0
    assert (steps["implement"]["failed_phase"], steps["document"]["failed_phase"]) == ("agent", "verifier")

    assert rows["multi-key-full"]["rewards"] == {"correctness": 1.0, "performance": 1.0}
    assert rows["multi-key-full"]["reward"] is None and rows["multi-key-full"]["steps"] is None
    partial = rows["multi-key-partial"]
    assert partial["rewards"] == {"correctness": 1.0, "style": 0.25, "size": 1.0}
    assert (partial["failed_phase"], partial["error"]) == ("verifier", "reward style=0.25 (expected 1)")

    for compose in ("compose-sidecar", "compose-only"):
        assert rows[compose]["failed_phase"] == "task"
        assert rows[compose]["error"] == f"task {compose}: {COMPOSE_ERROR}"
    for text in (
        "correctness=1 performance=1",
        "correctness=1 size=1 style=0.25",
        "prepare ok, implement FAIL, document FAIL",
        "step implement: solve.sh exited with status 3",
    ):
        assert text in table, text


# The formats' trials on the emulator path are the oracle test's; the nop agent runs nothing, and
# what its verdicts check (Harbor stopping at a step's min_reward, every channel at 0) is the SDK's
# no more than the report's.
@pytest.mark.slow
@DOCKER_PATH_ONLY
def test_nop_verdicts_on_public_task_formats(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    rows, _ = _validate(tmp_path, "nop", sandbox_sdk)
    assert {k: v["passed"] for k, v in rows.items()} == {
        "multi-step-pass": True,
        "multi-step-failing": True,
        "multi-key-full": True,
        "multi-key-partial": True,
        "compose-sidecar": False,
        "compose-only": False,
    }
    # The first step scored 0 under its min_reward = 1, so Harbor stopped there: skipped, not failed.
    assert [(s["name"], s["ran"]) for s in rows["multi-step-pass"]["steps"]] == [
        ("init", True),
        ("extend", False),
        ("report", False),
    ]
    assert rows["multi-key-partial"]["rewards"] == {"correctness": 0.0, "style": 0.0, "size": 0.0}


def test_compose_tasks_are_refused_before_any_sandbox(tmp_path: Path) -> None:
    before = {c["Id"] for c in managed_containers()}
    proc = run_cli("validate", str(PUBLIC / "compose-sidecar"))
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: task compose-sidecar: {COMPOSE_ERROR}"
    assert not orphaned_containers(before, proc.pid)


@pytest.mark.parametrize(
    ("rewards", "expected", "shortfall"),
    [
        ({"reward": 1.0, "style": 0.0}, 1.0, None),  # "reward" decides when present
        ({"correctness": 1.0, "performance": 1.0}, 1.0, None),
        ({"correctness": 1.0, "style": 0.25}, 1.0, "reward style=0.25 (expected 1)"),
        ({"b": 0.5, "a": 0.0}, 1.0, "reward a=0, b=0.5 (expected 1)"),
        ({"reward": 0.5}, 1.0, "reward 0.5 (expected 1)"),
        ({"reward": 0.0, "style": 1.0}, 0.0, "reward style=1 (expected 0)"),  # nop: every channel
        ({}, 1.0, "no reward produced"),
    ],
)
def test_reward_shortfall_names_the_channels(rewards: dict, expected: float, shortfall: str | None) -> None:
    assert reward_shortfall(rewards, expected) == shortfall


def test_a_step_that_never_ran_fails_the_oracle_even_when_the_mean_is_one() -> None:
    reading = TrialReading(
        reward=1.0,
        rewards={"reward": 1.0},
        steps=[
            StepReading(name="one", reward=1.0, rewards={"reward": 1.0}),
            StepReading(name="two", ran=True, failed_phase=TrialPhase.VERIFIER, error="RewardFileNotFoundError: none"),
            StepReading(name="three", ran=False),
        ],
    )
    verdict = judge(reading, "oracle")
    assert not verdict.passed and verdict.failed_phase == "verifier"
    assert verdict.error == (
        "step two: RewardFileNotFoundError: none; step three: did not run (an earlier step stopped the trial)"
    )
