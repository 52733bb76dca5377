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
from tests.conftest import SANDBOX_IMAGE
from tests.support.common import REPO

# exclusive: the sessions it runs check the whole engine for sandboxes of exited owners, which another
# worker's test may hold for a moment (a CLI it has just killed, before it removes what that left)
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

SESSION = """
from osmosis_harbor.sandbox import docker as docker_sdk


def test_makes_a_pool():
    docker_sdk.create_pool({pool!r}, {image!r}, replicas=1)
    if {delete!r}:
        docker_sdk.delete_pool({pool!r})
"""


def _session(tmp_path: Path, *, delete: bool, workers: int = 0) -> tuple[subprocess.CompletedProcess[str], str]:
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
            "-n",
            str(workers),
            str(test_file),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, pool


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist"])
def test_a_pool_left_behind_fails_the_session_and_is_deleted(tmp_path: Path, workers: int) -> None:
    """Under xdist the check runs once, on the controller, after the workers: it still fails the
    run and names the pool a worker left."""
    (tmp_path / "none.ini").write_text("[pytest]\n")
    proc, pool = _session(tmp_path, delete=False, workers=workers)
    assert proc.returncode != 0, proc.stdout
    assert f"warm pools leaked by this session (now deleted): {pool}" in proc.stdout, proc.stdout[-3000:]
    assert pool not in {p.name for p in docker_sdk.list_pools()}


def test_a_pool_deleted_by_its_test_passes(tmp_path: Path) -> None:
    (tmp_path / "none.ini").write_text("[pytest]\n")
    proc, _ = _session(tmp_path, delete=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
