"""What a test process is in a pytest-xdist run, and the directory the run's processes share.

Why one module: the exclusive lock, the run's leak check, the longest-first order and the
shared bundle cache all ask the same two questions (is this process an xdist worker; where is
the run's common directory), and one answer keeps them agreeing on the same place.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def is_worker(config: pytest.Config) -> bool:
    """An xdist worker (not a pytest that a test runs as a subprocess of its own)."""
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    """This process hands tests to xdist workers (``-n`` above 0) and runs none itself."""
    return not is_worker(config) and bool(getattr(config.option, "numprocesses", None))


def run_directory(config: pytest.Config) -> Path:
    """The directory the controller and every worker of one run share: the controller's base
    temp, which is the parent of each worker's own (pytest prunes it like any base temp)."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    base = factory.getbasetemp()
    return base.parent if is_worker(config) else base
