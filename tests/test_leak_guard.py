"""The session guard in ``conftest.py`` (``_no_leaked_sandboxes``) really flags a test that
forgets to delete its warm pool, and lets one that deletes it pass.

Each case is a tiny pytest session in a subprocess that loads this suite's conftest as a
plugin, with its test file in the test's own tmp dir.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import docker as docker_sdk

from .conftest import SANDBOX_IMAGE
from .support import REPO

pytestmark = pytest.mark.slow

SESSION = """
from osmosis_harbor.sandbox import docker as docker_sdk


def test_makes_a_pool():
    docker_sdk.create_pool({pool!r}, {image!r}, replicas=1)
    if {delete!r}:
        docker_sdk.delete_pool({pool!r})
"""


def _session(tmp_path: Path, *, delete: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    pool = f"leak{uuid.uuid4().hex[:6]}"
    test_file = tmp_path / f"test_leak_{'deleted' if delete else 'kept'}.py"
    test_file.write_text(SESSION.format(pool=pool, image=SANDBOX_IMAGE, delete=delete))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-c",
            str(tmp_path / "none.ini"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            str(test_file),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, pool


def test_a_pool_left_behind_fails_the_session_and_is_deleted(tmp_path: Path) -> None:
    (tmp_path / "none.ini").write_text("[pytest]\n")
    proc, pool = _session(tmp_path, delete=False)
    assert proc.returncode != 0, proc.stdout
    assert f"warm pools leaked by this session (now deleted): {pool}" in proc.stdout, proc.stdout[-3000:]
    assert pool not in {p.name for p in docker_sdk.list_pools()}


def test_a_pool_deleted_by_its_test_passes(tmp_path: Path) -> None:
    (tmp_path / "none.ini").write_text("[pytest]\n")
    proc, _ = _session(tmp_path, delete=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
