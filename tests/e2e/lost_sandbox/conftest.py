"""The lost-sandbox area's shared fixture: the tasks its rollouts run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.common import TASKS
from tests.support.lost_sandbox import GRADING_GATE


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    """``graded``: the template without tests (the Osmosis grader gives the reward);
    ``blocking-tests``: the template whose own tests wait on a gate before rewarding."""
    root = tmp_path / "tasks"
    graded = shutil.copytree(TASKS / "template", root / "graded")
    shutil.rmtree(graded / "tests")
    blocking = shutil.copytree(TASKS / "template", root / "blocking-tests")
    (blocking / "tests" / "test.sh").write_text(
        f"#!/bin/bash\nmkdir -p /logs/verifier\nmkfifo {GRADING_GATE} && read x < {GRADING_GATE}\n"
        "echo 1 > /logs/verifier/reward.txt\n"
    )
    return root
