"""What the flood tests share: a backend whose workflow runs what its scripted policy replies, a
flooder beside a victim rollout, and the engine filesystem's free space sampled throughout."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path

from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutStatus

from osmosis_harbor.backend import HarborBackend
from tests.support.common import FIXTURES, TASKS
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import SdkPath

PROJECT = FIXTURES / "rollout_project"
IMAGE = "python:3.12-slim"  # the template task's base image
MIB = 1024 * 1024


def make_backend(tmp_path: Path, bundles_dir: Path, path: SdkPath, n_concurrent: int = 2) -> HarborBackend:
    return HarborBackend(
        orchestrator=TrialQueue(n_concurrent=n_concurrent),
        tasks_dir=TASKS / "template",
        task_mode="template",
        agent="rollout_fixtures.workflows:OutputWorkflow",
        workflow_config="rollout_fixtures.workflows:fixture_config",
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=path.environment(),
        trials_dir=tmp_path / "trials",
    )


async def flood_beside_victim(backend: HarborBackend, fake_chat, flood: str) -> tuple[object, object]:
    """The flooder (its policy replies ``flood``) and the victim (``echo 42``), at once."""
    flooder, victim = await floods_beside_victim(backend, fake_chat, flood)
    return flooder, victim


async def floods_beside_victim(backend: HarborBackend, fake_chat, *floods: str) -> tuple[object, ...]:
    """A flooder for each of ``floods`` (its policy replies that) and the victim (``echo 42``),
    all at once; their results, the victim's last."""
    async with serve(backend) as url, client_for(url) as client:

        def rollout(reply: str, tag: str):
            return client.run_rollout(
                initial_messages=[{"role": "user", "content": f"reply: {reply}"}],
                chat_completions_url=fake_chat.base_url,
                rollout_id=f"{tag}-{uuid.uuid4().hex[:8]}",
                llm_api_key="sk-flood",
                grade=False,
            )

        return tuple(await asyncio.gather(*(rollout(flood, "flood") for flood in floods), rollout("echo 42", "victim")))


def assert_victim_fine(victim) -> None:
    assert victim.status is RolloutStatus.SUCCESS, victim.err_message
    assert victim.sample.messages[-1]["content"] == "42"


class FreeSpace:
    """The minimum free space (bytes, and inodes) of the engine's filesystem while the block runs,
    sampled often."""

    def __init__(self, path: str = "/var/lib/docker") -> None:
        self.path = path if os.path.isdir(path) else "/"
        self.start, self.start_inodes = self.now()
        self.lowest, self.lowest_inodes = self.start, self.start_inodes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> tuple[int, int]:
        fs = os.statvfs(self.path)
        return fs.f_bavail * fs.f_frsize, fs.f_favail

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            free, inodes = self.now()
            self.lowest, self.lowest_inodes = min(self.lowest, free), min(self.lowest_inodes, inodes)

    @property
    def dipped(self) -> int:
        """Bytes: how far the free space fell at its lowest."""
        return self.start - self.lowest

    @property
    def dipped_inodes(self) -> int:
        return self.start_inodes - self.lowest_inodes

    def __enter__(self) -> FreeSpace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
