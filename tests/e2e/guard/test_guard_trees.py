"""The verifier guard covers the toolchain as whole trees, and refuses what it cannot protect.

Each attack is the wrong answer, then a root workflow's change that forged 1.0 under a guard that
knew names rather than trees: a ``python313.zip`` where ``sys.path`` names one that does not
exist yet, holding ``json/__init__.py``; an ``enum/`` package beside the stdlib's ``enum.py``
(Python prefers the package). Both load the real module and, in the tests' ``score.py``, rewrite
the reward at exit. Under the guard each ends the rollout as the workflow's failure on ``docker``
and ``skypilot-emulator``; with the guard off each pays 1.0 (the positive controls).

A shell planted first on PATH (``/usr/local/sbin/sh``) is caught on ``docker``, whose exec runs
argv without a shell. On the emulator (SkyPilot's ``sh -c``) it would run first, unmarked, in every
later exec, so a root agent whose tests share its sandbox is refused there by default, naming the
ways out; with the explicit opt-in it runs and the attack pays: that combination is unprotected.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutResultResponse, RolloutStatus

from osmosis_harbor import settings
from osmosis_harbor.sandbox.sdk.registry import implementation
from osmosis_harbor.tasks.discovery import discover_tasks
from osmosis_harbor.tasks.verifier_shell import OPT_IN, RULE, shell_exec_refusal
from osmosis_harbor.validate.lint import LintMode, lint_dataset
from tests.e2e.guard.test_verifier_guard import DATASET, REWRITER, WRONG, _backend, _file, _rollouts
from tests.support.common import managed_containers
from tests.support.sdk_paths import EMULATOR, SdkPath

HONEST = ("sum-42", "echo 42 > /app/sum.txt")
OPT_IN_VAR = OPT_IN.split("=")[0]
# Loads the real stdlib module it shadows, then, in the tests' score.py, forges the reward at exit.
SHADOW = """
import atexit, importlib.util, os, sys
_std = os.path.dirname(os.__file__)
_pkg = os.path.join(_std, __name__)
_init = os.path.join(_pkg, "__init__.py")
_where = _init if os.path.exists(_init) and not __file__.startswith(_pkg + os.sep) else _pkg + ".py"
_spec = importlib.util.spec_from_file_location(__name__, _where, submodule_search_locations=[_pkg] if _where == _init else None)
_real = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _real
_spec.loader.exec_module(_real)
if sys.argv and sys.argv[0].endswith("score.py"):
    atexit.register(lambda: open("/logs/verifier/reward.json", "w").write('{"reward": 1.0}'))
"""
STDLIB = "$(python3 -c 'import os; print(os.path.dirname(os.__file__))')"
ZIP_OF_SYS_PATH = "[p for p in sys.path if p.endswith('.zip')][0]"
# Runs first in every exec that goes through the sandbox's sh: leaves an unmarked rewriter, hides itself.
PLANTED_SH = '#!/bin/dash\nrm -f /usr/local/sbin/sh\nsetsid python3 /tmp/rewriter.py </dev/null >/dev/null 2>&1 &\nexec /bin/dash "$@"\n'


def _attacks() -> dict[str, tuple[str, str]]:
    """Each attack's command (after the wrong answer) and what the guard's message must name."""
    shadow = _file("/tmp/shadow.py", SHADOW)
    zipped = f"python3 -c \"import sys, zipfile; z = zipfile.ZipFile({ZIP_OF_SYS_PATH}, 'w'); z.write('/tmp/shadow.py', 'json/__init__.py'); z.close()\""
    return {
        "stdlib-zip": (f"{shadow}; {zipped}", "python313.zip added (tree)"),
        "package-beside-module": (
            f"{shadow}; d={STDLIB}; mkdir $d/enum && cp /tmp/shadow.py $d/enum/__init__.py",
            "/enum added (tree)",
        ),
        "planted-sh": (
            f"{_file('/tmp/rewriter.py', REWRITER)}; {_file('/usr/local/sbin/sh', PLANTED_SH, '755')}",
            "/usr/local/sbin/sh added",
        ),
    }


@dataclass
class TreeRuns:
    sdk: SdkPath
    default: dict[str, RolloutResultResponse] = field(default_factory=dict)
    guarded: dict[str, RolloutResultResponse] = field(default_factory=dict)
    unguarded: dict[str, RolloutResultResponse] = field(default_factory=dict)


@pytest.fixture(scope="module", params=["docker", EMULATOR])
async def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TreeRuns]:
    sdk = (
        SdkPath("docker")
        if request.param == "docker"
        else SdkPath(EMULATOR, request.getfixturevalue("emulator_server"))
    )
    root = tmp_path_factory.mktemp(f"trees-{request.param}")
    attacks = {name: ("sum-42", f"{WRONG}; {command}") for name, (command, _) in _attacks().items()}
    out = TreeRuns(sdk)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root))
        patch.setenv("OSMOSIS_HARBOR_VERIFIER_ALLOWANCES", str(root / "allowances"))
        patch.delenv(OPT_IN_VAR, raising=False)
        out.default = await _rollouts(_backend(root, sdk, "default"), {"honest": HONEST})
        patch.setenv(OPT_IN_VAR, "1")  # where the SDK's exec runs a shell: unprotected, on purpose
        out.guarded = await _rollouts(_backend(root, sdk, "guarded"), {**attacks, "honest": HONEST})
        patch.setenv("OSMOSIS_HARBOR_VERIFIER_GUARD", "0")
        shadows = {name: attacks[name] for name in ("stdlib-zip", "package-beside-module")}
        out.unguarded = await _rollouts(_backend(root, sdk, "unguarded"), shadows)
    yield out
    if sdk.is_emulator:
        assert sdk.sandboxes_left() == [], "emulator sandboxes left behind"
    else:
        assert not managed_containers(owner_pid=os.getpid()), "sandboxes left behind"


def _forged(result: RolloutResultResponse) -> bool:
    return result.status is RolloutStatus.SUCCESS and result.sample is not None and result.sample.reward == 1.0


def _caught(result: RolloutResultResponse, named: str) -> None:
    assert result.status is RolloutStatus.FAILURE, f"{result.status} reward {result.sample and result.sample.reward}"
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert "the verifier's environment was tampered with" in (result.err_message or ""), result.err_message
    assert named in (result.err_message or ""), result.err_message
    assert result.sample is not None and result.sample.metrics["verifier_tampered"] == 1.0
    assert result.sample.reward in (None, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["stdlib-zip", "package-beside-module"])
def test_an_addition_anywhere_in_an_import_tree_is_tampering(runs: TreeRuns, attack: str) -> None:
    _caught(runs.guarded[attack], _attacks()[attack][1])


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["stdlib-zip", "package-beside-module"])
def test_without_the_guard_each_shadowing_module_forges_the_reward(runs: TreeRuns, attack: str) -> None:
    """Positive control: the same command, the guard off, pays 1.0 for the wrong answer."""
    result = runs.unguarded[attack]
    assert _forged(result), (attack, result.status, result.err_message)
    assert result.sample is not None and "verifier_tampered" not in result.sample.metrics


@pytest.mark.slow
def test_a_real_solve_still_scores_one_under_whole_trees(runs: TreeRuns) -> None:
    honest = runs.guarded["honest"]
    assert _forged(honest), honest.err_message
    assert honest.sample is not None and honest.sample.metrics["verifier_tampered"] == 0.0


@pytest.mark.slow
def test_a_root_agent_with_a_shared_verifier_is_refused_where_exec_runs_a_shell(runs: TreeRuns) -> None:
    """By default: refused on the emulator (validation_error, one line naming the three ways out),
    before any sandbox; on docker, whose exec runs argv without a shell, the same rollout runs."""
    result = runs.default["honest"]
    if not runs.sdk.is_emulator:
        assert _forged(result), result.err_message
        return
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    message = result.err_message or ""
    assert "task sum-42" in message and "fresh sandbox" in message, message
    assert "unprivileged [agent] user" in message and OPT_IN in message, message


@pytest.mark.slow
def test_a_planted_shell_is_caught_on_docker_and_pays_where_it_was_opted_into(runs: TreeRuns) -> None:
    """On docker nothing runs the planted ``sh`` before the check, which names it. On the
    emulator, opted in, it runs first in the next exec (the check's included), unmarked: it
    leaves a rewriter the check cannot end and removes itself, and the wrong answer pays 1.0.
    That is why the combination is refused unless opted into."""
    result = runs.guarded["planted-sh"]
    if runs.sdk.is_emulator:
        assert _forged(result), (result.status, result.err_message)
        assert result.sample is not None and result.sample.metrics["verifier_tampered"] == 0.0
    else:
        _caught(result, _attacks()["planted-sh"][1])


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
