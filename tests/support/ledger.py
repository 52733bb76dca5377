"""Helpers for the ledger tests: a ``SandboxEnvironment`` on a prebuilt image (nothing built),
and an owner process that makes a sandbox and a pool, reports them, then waits to be killed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
from tests.support.common import REPO, make_task


def environment_for(sdk: str, root: Path, image: str, *, stem: str = "ledger") -> SandboxEnvironment:
    """A trial environment on ``sdk`` whose task names the prebuilt ``image``; its sandbox is
    ``hb-<stem>-...``, so that a module removing its own sandboxes by prefix finds only its own."""
    task_dir = make_task(root / f"tasks-{uuid.uuid4().hex[:6]}", "ledger", toml_extra=f'docker_image = "{image}"\n')
    task = Task(task_dir)
    trial_paths = TrialPaths(root / f"trial-{uuid.uuid4().hex[:6]}")
    trial_paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        environment_config(sdk),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"{stem}-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
    )
    assert isinstance(env, SandboxEnvironment)
    return env


OWNER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from osmosis_harbor import settings
from osmosis_harbor.sandbox import load_sandbox_sdk
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from tests.support.ledger import environment_for

SDK, ROOT, IMAGE, POOL, FAIL_TERMINATE = sys.argv[1:6]

def refuse(handle_type):
    class Refused:
        async def aio(self, *args, **kwargs):
            raise ConnectionError("injected: the sandbox API is unavailable")
    handle_type.terminate = property(lambda self: Refused())

async def main():
    owner = SandboxOwner.make("test", config=settings.current())
    sandboxes = owner.sandboxes
    sdk = load_sandbox_sdk(SDK)
    with owner_scope(owner):
        env = environment_for(SDK, Path(ROOT), IMAGE)
        await env.start(force_build=False)  # mid-rollout: a trial's sandbox in use
        await sandboxes.pool_pending(POOL, SDK)  # mid-prewarm: a pool made
        await sdk.create_pool.aio(POOL, IMAGE, replicas=1)
        await sandboxes.pool_made(POOL, SDK)
        if FAIL_TERMINATE == "1":  # this owner's sandbox API refuses every terminate
            refuse(type(env.sandbox))
            await env.stop(delete=True)  # fails (twice: two API attempts); it stays in the ledger
    print(env.sandbox_name, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def start_owner(
    sdk: str, root: Path, image: str, pool: str, *, fail_terminate: bool = False
) -> tuple[subprocess.Popen[str], str]:
    """An owner process holding one sandbox (terminated-but-failed when asked) and one pool;
    returns it and its sandbox's name once both exist."""
    script = textwrap.dedent(OWNER_SCRIPT)
    args = [sys.executable, "-c", script, sdk, str(root), image, pool, "1" if fail_terminate else "0"]
    owner = subprocess.Popen(args, cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    name = owner.stdout.readline().strip()
    assert name, f"the owner process exited ({owner.wait()}) before making its sandbox"
    return owner, name


def cleanup(sdk: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_harbor", "cleanup", "--env", sdk, *extra],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


LEDGER_PREFIXES = ("hb-ledger-", "ledger-pool-")  # tests/e2e/sandbox/test_ledger_lifecycle.py
FAULT_PREFIXES = ("hb-fault-", "fault-")  # tests/e2e/sandbox/test_api_faults.py


def remove_own_emulator_sandboxes(prefixes: tuple[str, ...]) -> list[str]:
    """Remove the emulator sandboxes one module made (by its names' ``prefixes``), never another
    module's or run's: the engine is shared, an emulator server lists every emulator sandbox on it,
    and the modules run at once on different workers (one module removing the other's live
    sandboxes failed both)."""
    import docker

    from osmosis_harbor.sandbox.emulator.server.state import EMULATOR_OWNER_HOST

    client = docker.from_env()
    removed = []
    for container in client.api.containers(all=True, filters={"label": "osmosis-harbor.managed=1"}):
        labels = container.get("Labels") or {}
        name = container["Names"][0].lstrip("/")
        if labels.get("osmosis-harbor.owner-host") == EMULATOR_OWNER_HOST and name.startswith(prefixes):
            client.api.remove_container(container["Id"], force=True)
            removed.append(name)
    return removed
