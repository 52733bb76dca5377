"""A task's own tests run in a fresh sandbox of its image: what a root workflow planted in its own
sandbox never reaches them (``tasks/verification.py``, docs/threat-model.md "Verification modes").

Every rollout runs ``OutputWorkflow``, whose scripted policy replies with a shell command the
workflow runs as root: the wrong answer (``7`` where ``tests/fixtures/fresh_dataset/sum-42``
wants ``42``), then one plant the guard's list of names did not know: a ``json`` package in the
interpreter's import-path zip that did not exist, an ``enum`` package beside ``enum.py``, a
``sh`` and ``bash`` earlier on PATH, or a ``json.py`` in the workdir that the tests' ``python -m``
run from there would import first (dropped from the carried workdir, ``tasks/carried.py``).
Through the real backend and the osmosis server, on ``docker`` and ``skypilot-emulator``, none
pays in the fresh mode. Positive control: the same commands with the tests in the agent's
sandbox and the guard off pay 1.0. An honest answer scores 1, a wrong one 0, and a file deleted
from the workdir is gone for the tests too.

Which runs where: both SDK paths run the answers, the deletion, the shell on PATH (each SDK's exec
runs a command differently: argv, or under ``sh -c``) and the module in the workdir (the workdir
is carried by each SDK's own transfers), each with its positive control. The two plants in the
image's own trees and ``validate``'s report of each mode (decided on the host) run on docker
only: a fresh sandbox of the image holds neither plant on either path, as the shell shows.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from osmosis_ai.rollout.types import RolloutResultResponse, RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.sandbox.guard import Allowance
from osmosis_harbor.tasks.carried import carried_directories, drop_loaded_names
from osmosis_harbor.tasks.discovery import discover_tasks
from osmosis_harbor.tasks.materialize import prepare_task
from osmosis_harbor.tasks.verification import VerificationMode, decide_verification, glob_prefix
from osmosis_harbor.validate import validate_tasks
from osmosis_harbor.validate.report import TaskValidation
from tests.e2e.guard.dataset_rollouts import (
    AUDITED,
    DOCKER_ONLY,
    EVERY_SDK,
    WRONG,
    assert_none_left,
    backend,
    file,
    rollouts,
    sdk_of,
)
from tests.support.common import FIXTURES, TASKS
from tests.support.sdk_paths import SdkPath

DATASET = FIXTURES / "fresh_dataset"
HONEST = "echo 42 > /app/sum.txt; rm /app/stale.txt"
# Plants, in the image's own standard library (found at run time), a module that loads the real
# one in its place and, as the process exits, writes a perfect reward where Harbor reads it
# (after the tests wrote theirs): ``zip``, a ``json`` package in the import path's zip entry that
# did not exist; ``beside``, an ``enum`` package next to ``enum.py`` (a package wins); ``workdir``,
# a ``json.py`` in the workdir, first on the import path of the tests' ``python -m`` run from there.
PLANT = r'''
import os, sys, sysconfig, zipfile
SHADOW = """
import atexit, importlib.util, os, sys
_spec = importlib.util.spec_from_file_location(%(name)r, %(real)r, submodule_search_locations=%(search)r)
_real = importlib.util.module_from_spec(_spec)
sys.modules[%(name)r] = _real
_spec.loader.exec_module(_real)
def _forge():
    if os.path.exists("/logs/verifier/reward.json"):
        with open("/logs/verifier/reward.json", "w") as f:
            f.write('{"reward": 1.0}')
atexit.register(_forge)
"""
stdlib = sysconfig.get_paths()["stdlib"]
if sys.argv[1] == "zip":
    entry = next(p for p in sys.path if p.endswith(".zip") and not os.path.exists(p))
    source = SHADOW % dict(name="json", real=stdlib + "/json/__init__.py", search=[stdlib + "/json"])
    with zipfile.ZipFile(entry + ".new", "w") as z:
        z.writestr("json/__init__.py", source)
    os.replace(entry + ".new", entry)
elif sys.argv[1] == "workdir":
    with open("/app/json.py", "w") as f:
        f.write(SHADOW % dict(name="json", real=stdlib + "/json/__init__.py", search=[stdlib + "/json"]))
else:
    os.makedirs(stdlib + "/enum.new")
    with open(stdlib + "/enum.new/__init__.py", "w") as f:
        f.write(SHADOW % dict(name="enum", real=stdlib + "/enum.py", search=None))
    os.rename(stdlib + "/enum.new", stdlib + "/enum")
'''
# Runs each command with the real shell of its name (SkyPilot's exec runs argv under ``sh -c``;
# Harbor's commands are ``bash -c``: both found on PATH), then forges the reward the command left.
SHELL = (
    '#!/bin/dash\n"/bin/${0##*/}" "$@"\ncode=$?\n'
    "[ -f /logs/verifier/reward.json ] && echo '{\"reward\": 1.0}' > /logs/verifier/reward.json\nexit $code\n"
)


def _attacks() -> dict[str, str]:
    plant = file("/tmp/plant.py", PLANT)
    return {
        "import-path-zip": f"{plant} && python3 /tmp/plant.py zip",
        "package-beside-module": f"{plant} && python3 /tmp/plant.py beside",
        "module-in-workdir": f"{plant} && python3 /tmp/plant.py workdir",
        "shell-on-path": f"{file('/usr/local/sbin/sh', SHELL, '755')}; {file('/usr/local/sbin/bash', SHELL, '755')}",
    }


EVERY_SDK_ATTACKS = ("module-in-workdir", "shell-on-path")  # the workdir's transfers, each SDK's exec
DOCKER_ATTACKS = [name for name in _attacks() if name not in EVERY_SDK_ATTACKS]


@dataclass
class Runs:
    sdk: SdkPath
    fresh: dict[str, RolloutResultResponse] = field(default_factory=dict)
    shared: dict[str, RolloutResultResponse] = field(default_factory=dict)
    validated: dict[str, TaskValidation] = field(default_factory=dict)


@pytest.fixture(scope="module", params=EVERY_SDK)
async def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Runs]:
    sdk = sdk_of(request)
    root = tmp_path_factory.mktemp(f"fresh-{request.param}")
    ran = [name for name in _attacks() if not sdk.is_emulator or name in EVERY_SDK_ATTACKS]
    attacks = {name: ("sum-42", f"{WRONG}; {_attacks()[name]}") for name in ran}
    out = Runs(sdk)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root))
        patch.setenv("OSMOSIS_HARBOR_VERIFIER_ALLOWANCES", str(root / "allowances"))
        fresh = {
            **attacks,
            "honest": ("sum-42", HONEST),
            "wrong": ("sum-42", WRONG),
            "stale-left": ("sum-42", "echo 42 > /app/sum.txt"),
        }
        out.fresh = await rollouts(backend(root, sdk, "fresh", DATASET), fresh)
        if not sdk.is_emulator:
            report = await validate_tasks(discover_tasks(DATASET), environment=sdk.environment(), agent="oracle")
            out.validated = {row.id: row for row in report.tasks}
        # Positive control: the tests in the agent's sandbox, the guard off.
        patch.setenv("OSMOSIS_HARBOR_FRESH_VERIFIER", "0")
        patch.setenv("OSMOSIS_HARBOR_VERIFIER_GUARD", "0")
        patch.setenv(*AUDITED)  # the fresh batch audited these images
        shared = {**attacks, "honest": ("sum-42", HONEST)}
        out.shared = await rollouts(backend(root, sdk, "shared", DATASET), shared)
    yield out
    assert_none_left(sdk)


def _reward(result: RolloutResultResponse) -> float | None:
    assert result.status is RolloutStatus.SUCCESS, (result.status, result.err_message)
    return result.sample.reward if result.sample is not None else None


def test_an_honest_answer_scores_one_and_a_wrong_one_zero(runs: Runs) -> None:
    assert _reward(runs.fresh["honest"]) == 1.0
    assert _reward(runs.fresh["wrong"]) == 0.0
    honest = runs.fresh["honest"].sample
    assert honest is not None and "verifier_tampered" not in honest.metrics  # no guard: nothing to guard


def test_a_deletion_in_the_workdir_reaches_the_tests(runs: Runs) -> None:
    """The image has ``/app/stale.txt``; the right answer without deleting it scores 0, with (the
    honest rollout) 1: the verifier's workdir is the agent's, not the image's with the agent's on top."""
    assert _reward(runs.fresh["stale-left"]) == 0.0
    assert _reward(runs.fresh["honest"]) == 1.0


def _assert_no_pay(runs: Runs, attack: str) -> None:
    assert _reward(runs.fresh[attack]) == 0.0, attack


def _assert_pays_unguarded(runs: Runs, attack: str) -> None:
    assert _reward(runs.shared["honest"]) == 1.0
    assert _reward(runs.shared[attack]) == 1.0, attack


@pytest.mark.parametrize("attack", EVERY_SDK_ATTACKS)
def test_no_plant_in_the_agents_sandbox_pays_in_a_fresh_one(runs: Runs, attack: str) -> None:
    _assert_no_pay(runs, attack)


@pytest.mark.parametrize("attack", EVERY_SDK_ATTACKS)
def test_in_the_agents_sandbox_unguarded_each_plant_pays(runs: Runs, attack: str) -> None:
    """Positive control: the same command, the tests in the agent's sandbox and the guard off."""
    _assert_pays_unguarded(runs, attack)


@DOCKER_ONLY
@pytest.mark.parametrize("attack", DOCKER_ATTACKS)
def test_no_plant_in_the_images_trees_pays_in_a_fresh_one(runs: Runs, attack: str) -> None:
    """Docker only: a plant in the image's trees is not carried on either path (only the workdir
    and the data roots are), and a fresh sandbox of the image lacks it, as the shell on both shows."""
    _assert_no_pay(runs, attack)


@DOCKER_ONLY
@pytest.mark.parametrize("attack", DOCKER_ATTACKS)
def test_in_the_agents_sandbox_unguarded_each_tree_plant_pays(runs: Runs, attack: str) -> None:
    """Positive control of each plant run on docker only."""
    _assert_pays_unguarded(runs, attack)


@DOCKER_ONLY
def test_validate_runs_each_task_where_training_would(runs: Runs) -> None:
    """The oracle passes in each mode, and the report says which and why. Docker only: the mode
    is the host's decision; the emulator's validate runs are ``cli/test_validate.py``'s. A
    multi-step task's mode and reason: ``test_the_decision_and_its_reason`` (the report's row is
    that decision's, as these rows show); its oracle through validate: ``cli/test_public_formats.py``."""
    for row in runs.validated.values():
        assert row.passed and row.reward == 1.0, (row.id, row.error)
    modes = {task: row.verification for task, row in runs.validated.items()}
    assert modes["sum-42"] == {"mode": "fresh", "reason": "fresh: single-step, no service"}
    assert modes["service-declared"] == {"mode": "shared", "reason": "shared: the solution leaves port 50051 listening"}


# ── the decision, per case ─────────────────────────────────────────────────────────────────────


def _task(tmp_path: Path, source: Path, *, verifier: str = "", extra: str = "") -> Path:
    task = shutil.copytree(source, tmp_path / source.name)
    toml = task / "task.toml"
    text = toml.read_text().replace('environment_mode = "shared"\n', "")
    toml.write_text(text.replace("[verifier]\n", f"[verifier]\n{verifier}") + extra)
    return task


def test_the_decision_and_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_VERIFIER_ALLOWANCES", str(tmp_path / "allow"))
    plain = decide_verification(_task(tmp_path / "a", DATASET / "sum-42"), config=settings.current())
    assert (plain.mode, plain.reason) == (VerificationMode.FRESH, "fresh: single-step, no service")
    assert plain.carried == ("/app", "/srv")
    explicit = decide_verification(
        _task(tmp_path / "b", DATASET / "sum-42", verifier='environment_mode = "shared"\n'), config=settings.current()
    )
    assert explicit.mode is VerificationMode.SHARED
    assert explicit.reason == 'shared: task.toml declares environment_mode = "shared"'
    separate = decide_verification(
        _task(tmp_path / "c", TASKS / "json-reward", verifier='environment_mode = "separate"\n'),
        config=settings.current(),
    )
    assert separate.mode is VerificationMode.SEPARATE and "separate" in separate.reason
    ports = decide_verification(_task(tmp_path / "d", DATASET / "service-declared"), config=settings.current())
    assert (ports.mode, ports.reason) == (VerificationMode.SHARED, "shared: the solution leaves port 50051 listening")
    recorded = _task(tmp_path / "e", DATASET / "sum-42")
    assert (
        decide_verification(recorded, allowance=Allowance(ports=frozenset({8080})), config=settings.current()).mode
        is VerificationMode.SHARED
    )
    steps = decide_verification(FIXTURES / "guard_dataset" / "two-steps", config=settings.current())
    assert steps.mode is VerificationMode.SHARED and "multi-step" in steps.reason
    declared = _task(
        tmp_path / "f",
        DATASET / "sum-42",
        extra='\n[metadata.osmosis_harbor.verifier_allowance]\npaths = ["/etc/nginx/**", "/var/www/site.conf"]\n',
    )
    assert decide_verification(declared, config=settings.current()).carried == (
        "/app",
        "/srv",
        "/etc/nginx",
        "/var/www/site.conf",
    )
    monkeypatch.setenv("OSMOSIS_HARBOR_FRESH_VERIFIER", "0")
    off = decide_verification(_task(tmp_path / "g", DATASET / "sum-42"), config=settings.current())
    assert (off.mode, off.reason) == (VerificationMode.SHARED, "shared: OSMOSIS_HARBOR_FRESH_VERIFIER=0")


def test_a_glob_carries_only_its_fixed_directory() -> None:
    assert glob_prefix("/etc/nginx/**") == "/etc/nginx"
    assert glob_prefix("/opt/app/*.conf") == "/opt/app"
    assert glob_prefix("/srv/data") == "/srv/data"
    assert glob_prefix("/**") == "/"


def test_the_carried_workdir_loses_what_the_verifiers_tools_would_load(tmp_path: Path) -> None:
    for name in ("json.py", "_json.cpython-312-x86_64-linux-gnu.so", "sitecustomize.py", "x.pth", "conftest.py"):
        (tmp_path / name).write_text("x")
    for name in ("answer.txt", "solution.py", "pyproject.toml", "pytest.ini"):
        (tmp_path / name).write_text("x")
    for package, init in (("enum", "__init__.py"), ("_pytest", "__init__.pyc"), ("mypkg", "__init__.py")):
        (tmp_path / package).mkdir()
        (tmp_path / package / init).write_text("")
    (tmp_path / "logging").mkdir()  # no __init__: a namespace portion, which never shadows a module
    (tmp_path / "re").symlink_to(tmp_path / "mypkg")
    dropped = drop_loaded_names(tmp_path)
    assert sorted(dropped) == sorted(
        [
            "json.py",
            "_json.cpython-312-x86_64-linux-gnu.so",
            "sitecustomize.py",
            "x.pth",
            "conftest.py",
            "pytest.ini",
            "enum",
            "_pytest",
            "re",
        ]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "answer.txt",
        "logging",
        "mypkg",
        "pyproject.toml",
        "solution.py",
    ]
    assert (tmp_path / "mypkg" / "__init__.py").exists()  # a link is removed as a link


def test_a_fresh_copy_names_its_carried_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Those the host gives an empty copy when the agent's is missing: never the image's instead."""
    monkeypatch.setenv("OSMOSIS_HARBOR_VERIFIER_ALLOWANCES", str(tmp_path / "allow"))
    task = _task(
        tmp_path,
        DATASET / "sum-42",
        extra='\n[metadata.osmosis_harbor.verifier_allowance]\npaths = ["/etc/x/*", "/tmp/done"]\n',
    )
    copy = prepare_task(
        task, tmp_path / "copy", fresh_verifier=decide_verification(task, config=settings.current()).carried
    )
    assert carried_directories(copy.path) == ["/app", "/srv", "/etc/x"]
    assert carried_directories(task) == []  # not carried: its tests run in the agent's sandbox
