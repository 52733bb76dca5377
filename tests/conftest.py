"""Shared pytest fixtures only (helpers live in tests/support.py). Keep this file small."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

SANDBOX_IMAGE = os.environ.get("OSMOSIS_HARBOR_TEST_IMAGE", "debian:trixie-slim")


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """A locally present image (no registry is reachable, nothing is ever pulled)."""
    return SANDBOX_IMAGE


@pytest.fixture(scope="session")
def docker_sandbox_sdk() -> ModuleType:
    """The Docker implementation of ``sky.sandbox``; skips when no engine is reachable."""
    from osmosis_harbor.sandbox import docker_sdk

    try:
        docker_sdk.ls()
    except docker_sdk.DockerEngineUnavailable as exc:
        pytest.skip(str(exc))
    return docker_sdk


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_sandboxes() -> Iterator[None]:
    """Fail the session if it leaves managed containers behind, after removing them.

    Removing first means one leaky run does not poison the next one. Only this process's
    containers count, so parallel sessions on the same engine do not interfere.
    """
    yield
    docker_sdk = sys.modules.get("osmosis_harbor.sandbox.docker_sdk")
    if docker_sdk is None:  # nothing in this session touched the Docker sandboxes
        return
    try:
        leftovers = docker_sdk.remove_all(owner_pid=os.getpid())
    except docker_sdk.DockerEngineUnavailable:
        return
    assert not leftovers, "managed containers leaked by this session (now removed): " + ", ".join(
        f"{c.name} (pool={c.pool})" for c in leftovers
    )
