"""The README's claim that the command line, ``HarborBackend`` and ``validate_tasks`` set
``LITELLM_LOCAL_MODEL_COST_MAP`` themselves (so litellm, imported by Harbor's agents, never
downloads its price map), and that a value the user set wins.

Each entry point runs in a fresh interpreter whose environment lacks the variable (the
test process's own environment may have it from an earlier test), which reports the value
before and after the entry point ran and whether litellm was imported before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.common import REPO, TASKS

VARIABLE = "LITELLM_LOCAL_MODEL_COST_MAP"

ENTRY_POINTS = {
    "cli": (
        "from osmosis_harbor.cli import main\n"
        "code = main(['validate', '/nonexistent-osmosis-harbor-dataset'])\n"
        "assert code == 2, code\n"
    ),
    "backend": (
        "from harbor.trial.queue import TrialQueue\n"
        "from osmosis_harbor import HarborBackend\n"
        "from osmosis_harbor.sandbox import environment_config\n"
        f"HarborBackend(orchestrator=TrialQueue(n_concurrent=1), tasks_dir=Path({str(TASKS / 'template')!r}),\n"
        "              task_mode='template', agent='oracle', environment_config=environment_config('docker'))\n"
    ),
    "validate_tasks": (
        "import asyncio\n"
        "from osmosis_harbor import validate_tasks\n"
        "from osmosis_harbor.sandbox import environment_config\n"
        "report = asyncio.run(validate_tasks([], environment=environment_config('docker')))\n"
    ),
}


def _probe(entry: str, preset: str | None) -> dict[str, object]:
    script = (
        "import json, os, sys\n"
        "from pathlib import Path\n"
        f"before = os.environ.get({VARIABLE!r})\n"
        "litellm_before = 'litellm' in sys.modules\n"
        + ENTRY_POINTS[entry]
        + f"print(json.dumps({{'before': before, 'after': os.environ.get({VARIABLE!r}), "
        "'litellm_before': litellm_before}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if preset is not None:
        env[VARIABLE] = preset
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_each_entry_point_sets_the_variable_itself(entry: str) -> None:
    report = _probe(entry, preset=None)
    assert report == {"before": None, "after": "True", "litellm_before": False}


def test_a_value_the_user_set_wins() -> None:
    """Every entry point calls the same ``settings.use_bundled_model_prices`` (proved above by
    its effect): one entry point shows that it keeps the user's value."""
    assert _probe("cli", preset="False")["after"] == "False"


def test_this_test_run_does_not_set_it_for_everyone() -> None:
    """No test module sets the variable at import time for the whole run (the CLI subprocesses
    of other tests must prove the claim too): only entry points called in this process may."""
    for path in (REPO / "tests").glob("*.py"):
        text = path.read_text()
        assert f'os.environ.setdefault("{VARIABLE}"' not in text, path.name
        assert f'os.environ["{VARIABLE}"]' not in text, path.name
