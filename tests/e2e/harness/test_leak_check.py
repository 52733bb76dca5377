"""The session's leak check (``tests/support/leaks.py``) on the emulator path: it counts the sandboxes an
emulator server of this session made and left, even after that server stopped, and never one of
another session's server on the same engine (positive control: the same sandbox is counted once
its server is this session's). Warm pools likewise, even once the other session's server has
stopped (its pool's owner is then an exited process)."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

from osmosis_harbor.sandbox import docker as docker_sdk
from osmosis_harbor.sandbox import emulator as sky
from tests.support.emulator import (
    SESSION_SERVERS,
    emulator_env,
    push_to_local_registry,
    remove_emulator_sandboxes,
    start_server,
    stop_server,
)
from tests.support.leaks import session_leaks, session_pools


def _leak_names(started: float) -> set[str]:
    return {name for _, name in session_leaks(started, SESSION_SERVERS)}


def test_emulator_sandboxes_of_this_session_are_leaks_and_no_one_elses(tmp_path: Path, sandbox_image: str) -> None:
    image = push_to_local_registry(sandbox_image)
    started = time.time() - 1
    pools = [f"leak-pool-ours-{uuid.uuid4().hex[:6]}", f"leak-pool-theirs-{uuid.uuid4().hex[:6]}"]
    ours = start_server(tmp_path / "ours")
    theirs = start_server(tmp_path / "theirs")
    SESSION_SERVERS.discard(theirs.process.pid)  # as if another test session had started it
    try:
        with emulator_env(ours.url):
            mine = sky.create(name=f"leak-ours-{uuid.uuid4().hex[:6]}", image=image, timeout=600)
        with emulator_env(theirs.url):
            other = sky.create(name=f"leak-theirs-{uuid.uuid4().hex[:6]}", image=image, timeout=600)
        with emulator_env(ours.url):
            sky.create_pool(pools[0], image, replicas=0)
        with emulator_env(theirs.url):
            sky.create_pool(pools[1], image, replicas=0)
        leaks = _leak_names(started)
        assert mine.name in leaks
        assert other.name not in leaks, "another session's emulator sandbox counted as this session's leak"
        stop_server(ours)  # the server is gone, its sandbox stays (as on SkyPilot): still this session's leak
        assert mine.name in _leak_names(started)
        stop_server(theirs)  # another session's server, stopped: its pool is still not this session's
        assert pools[0] in session_pools(started, SESSION_SERVERS)
        assert pools[1] not in session_pools(started, SESSION_SERVERS), "another session's pool counted"
        SESSION_SERVERS.add(theirs.process.pid)  # positive control: once its server is ours, it counts
        assert other.name in _leak_names(started)
        assert pools[1] in session_pools(started, SESSION_SERVERS)
    finally:
        SESSION_SERVERS.discard(theirs.process.pid)
        for pool in pools:
            with contextlib.suppress(docker_sdk.PoolNotFoundError):
                docker_sdk.delete_pool(pool)
        removed = remove_emulator_sandboxes(ours) + remove_emulator_sandboxes(theirs)
        stop_server(theirs)
        stop_server(ours)
    assert sorted(removed) == sorted([mine.name, other.name])
    assert not _leak_names(started) & {mine.name, other.name}
    assert not set(session_pools(started, SESSION_SERVERS)) & set(pools)
