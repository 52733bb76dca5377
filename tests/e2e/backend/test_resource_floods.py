"""One rollout's flood stays in its own sandbox: a victim rollout in flight beside it succeeds.

Each test runs two rollouts at once through the real osmosis server, on both SDK paths: the
flooder, whose workflow runs the command its scripted policy replies with, and a victim that
answers 42. The floods, each with small bounds so a test takes seconds:

* the writable layer: ``dd`` outside ``/tmp``, file after file (each file stops at the bound
  itself), until the sandbox is evicted at its disk bound (``OSMOSIS_HARBOR_SANDBOX_DISK_MB``,
  read by the process that creates the sandboxes: this one on the Docker path, the emulator's
  server on the other); the host's free space is sampled throughout and never falls by much more
  than the bound;
* stdout: 256 MiB printed to the workflow's own stdout (the exec's stream); the host keeps a
  bounded tail, so the server process (and the emulator's) grows by far less than that;
* a fork bomb: stopped at the sandbox's pids limit, and named as such;
* a memory hog: killed at the sandbox's memory limit, named as such, the sandbox's own failure.

Positive control of the disk bound: the same flood with the bound off writes past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harbor.models.task.config import TaskConfig
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import load_sandbox_sdk
from osmosis_harbor.sandbox.docker.evictions import inode_limit_message
from osmosis_harbor.sandbox.sdk.bounds import PIDS_LIMIT
from osmosis_harbor.sandbox.sdk.liveness import SandboxState, sandbox_state
from tests.support.common import TASKS, await_until
from tests.support.emulator import EmulatorServer, private_emulator, push_to_local_registry
from tests.support.floods import (
    IMAGE,
    MIB,
    PROJECT,
    FreeSpace,
    assert_victim_fine,
    flood_beside_victim,
    floods_beside_victim,
    make_backend,
)
from tests.support.rollout_server import client_for, serve
from tests.support.sdk_paths import SdkPath

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("osmosis_home")]

DISK_MB = 192


@pytest.fixture(scope="module")
def bounded_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    """An emulator server of this module's own, started with the small disk bound (its sandboxes
    are bounded by the server's settings, as SkyPilot's pods by the cluster's)."""
    push_to_local_registry(IMAGE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OSMOSIS_HARBOR_SANDBOX_DISK_MB", str(DISK_MB))
        with private_emulator(tmp_path_factory.mktemp("floods-emulator"), set_env=False) as server:
            yield server


@pytest.fixture(params=["docker", "skypilot-emulator"])
def flood_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[SdkPath]:
    """Both SDK paths, each bounded at ``DISK_MB`` where its sandboxes are made."""
    if request.param == "docker":
        monkeypatch.setenv("OSMOSIS_HARBOR_SANDBOX_DISK_MB", str(DISK_MB))
        yield SdkPath("docker")
        return
    from tests.support.emulator import emulator_env

    server = request.getfixturevalue("bounded_emulator")
    with emulator_env(server.url):
        yield SdkPath("skypilot-emulator", server)


# 8 GiB in files of 128 MiB, each under the file size limit (the disk bound) that stops one file.
DISK_FLOOD = "for i in $(seq 64); do dd if=/dev/zero of=/workspace/fill$i bs=1M count=128 || exit; done; echo filled"


async def test_positive_control_without_the_bound_the_flood_writes_past_it(
    tmp_path: Path, bundles_dir: Path, fake_chat, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same flood, smaller, with the bound off: it writes past the bound and succeeds, so
    the eviction above was the bound's doing."""
    monkeypatch.setenv("OSMOSIS_HARBOR_SANDBOX_DISK_MB", "0")
    backend = make_backend(tmp_path, bundles_dir, SdkPath("docker"))
    past = f"dd if=/dev/zero of=/workspace/fill bs=1M count={DISK_MB * 2} 2>/dev/null && du -sm /workspace/fill"
    flooder, victim = await flood_beside_victim(backend, fake_chat, past)
    assert_victim_fine(victim)
    assert flooder.status is RolloutStatus.SUCCESS, flooder.err_message
    assert int(flooder.sample.messages[-1]["content"].split()[0]) >= DISK_MB * 2  # du's MiB, rounded up


class PeakRss:
    """The highest resident set size of a process while the block runs, sampled often."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self.now()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for pid {self.pid}")

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# head's status is the pipeline's: "printed" only once all of it went to the stream.
STDOUT_FLOOD = f"yes osmosis | head -c {256 * MIB} > /proc/$PPID/fd/1 && echo printed"


async def test_a_stdout_flood_keeps_host_memory_bounded_and_the_victim_succeeds(
    flood_path: SdkPath, tmp_path: Path, bundles_dir: Path, fake_chat
) -> None:
    """256 MiB on the workflow's stdout: the host process (and the emulator's server, which
    holds the exec's output on that path) grows by far less than that."""
    backend = make_backend(tmp_path, bundles_dir, flood_path)
    server = flood_path.emulator.process.pid if flood_path.emulator is not None else os.getpid()
    with PeakRss(os.getpid()) as host, PeakRss(server) as sdk_side:
        flooder, victim = await flood_beside_victim(backend, fake_chat, STDOUT_FLOOD)
    assert_victim_fine(victim)
    assert flooder.status is RolloutStatus.SUCCESS, flooder.err_message
    assert flooder.sample.messages[-1]["content"] == "printed"
    for who, rss in (("host", host), ("sdk side", sdk_side)):
        grew = rss.peak - rss.start
        assert grew < 96 * MIB, f"the {who} process grew by {grew / MIB:.0f} MiB for 256 MiB of stdout"


# One line (the scripted policy replies with one): forks sleepers until the kernel refuses one.
FORK_BOMB = (
    "python3 -c \"exec('import os, time\\nn = 0\\nwhile True:\\n try:\\n  pid = os.fork()\\n"
    " except OSError as exc:\\n  print(\\'stopped after\\', n, \\'forks:\\', exc.strerror); break\\n"
    " if pid == 0:\\n  os.closerange(0, 3); time.sleep(30); os._exit(0)\\n n += 1')\""
)


# The same bomb in a session of its own, which it kills once a fork is refused; then the command
# kills the workflow that ran it: a workflow taken down by its fork bomb, in a sandbox whose pids
# are free again.
FATAL_FORK_BOMB = (
    FORK_BOMB.replace("python3 -c", "setsid -w python3 -c", 1).replace("break", "os.killpg(0, 9)") + "; kill -9 $PPID"
)


async def test_a_disk_flood_and_fork_bombs_end_as_their_workflows_and_the_victim_succeeds(
    flood_path: SdkPath, tmp_path: Path, bundles_dir: Path, fake_chat
) -> None:
    """A disk flood and two fork bombs beside one victim, on one backend.

    The disk flood is evicted at its bound: its own ``agent_error`` naming the storage limit and
    its setting, and the engine's free space fell by at most the bound and what one tick of the
    watch lets through.

    The bomb's forks are refused at the sandbox's pids limit, while the victim's sandbox, whose
    limit is its own, starts its processes. The sleepers it leaves hold that limit: on SkyPilot's
    path (every SDK's by default) every transfer is a command in the sandbox, or rides one, and
    cannot start, so the workflow left no outputs the host could take: its own failure
    (``agent_error``), never the host's. The other bomb takes its workflow down with it (in a
    sandbox whose pids are free again): the failure names the pids limit, not an OOM kill."""
    backend = make_backend(tmp_path, bundles_dir, flood_path, n_concurrent=4)
    with FreeSpace() as space:
        flooder, bomb, fatal, victim = await floods_beside_victim(
            backend, fake_chat, DISK_FLOOD, FORK_BOMB, FATAL_FORK_BOMB
        )
    assert_victim_fine(victim)
    assert flooder.status is RolloutStatus.FAILURE
    assert flooder.err_category is RolloutErrorCategory.AGENT_ERROR, flooder.err_message
    assert f'ephemeral storage limit "{DISK_MB}Mi"' in flooder.err_message, flooder.err_message
    assert "OSMOSIS_HARBOR_SANDBOX_DISK_MB" in flooder.err_message and "lost" not in flooder.err_message, (
        flooder.err_message
    )
    # The 8 GiB flood took the disk down by at most the bound and what one tick of the watch lets
    # through (the victim's own layer and other users of this machine included).
    dipped = space.dipped
    assert dipped < 2048 * MIB, f"free space fell by {dipped / MIB:.0f} MiB"

    assert bomb.status is RolloutStatus.FAILURE
    assert bomb.err_category is RolloutErrorCategory.AGENT_ERROR, bomb.err_message
    assert fatal.status is RolloutStatus.FAILURE
    assert fatal.err_category is RolloutErrorCategory.AGENT_ERROR, fatal.err_message
    assert f"its pids limit ({PIDS_LIMIT} tasks) refused" in fatal.err_message, fatal.err_message
    assert "137" in fatal.err_message and "OOM" not in fatal.err_message, fatal.err_message


async def test_a_memory_hog_is_killed_at_its_limit_named_as_such_and_the_victim_succeeds(
    flood_path: SdkPath, tmp_path: Path, bundles_dir: Path, fake_chat
) -> None:
    """The workflow itself fills memory (``MemoryHogWorkflow``) in a 256 MiB sandbox: the
    kernel kills it there, the rollout is its own ``agent_error`` naming the OOM kill at the
    sandbox's memory limit, and a victim beside it, in a sandbox of the default size, succeeds."""
    task = shutil.copytree(TASKS / "template", tmp_path / "small-template")
    config = TaskConfig.model_validate_toml((task / "task.toml").read_text())
    config.environment.memory_mb = 256
    (task / "task.toml").write_text(config.model_dump_toml())
    common = dict(
        orchestrator=TrialQueue(n_concurrent=1),
        task_mode="template",
        code_dir=PROJECT,
        bundles_dir=bundles_dir,
        environment_config=flood_path.environment(),
    )
    hog = HarborBackend(
        tasks_dir=task, agent="rollout_fixtures.workflows:MemoryHogWorkflow", trials_dir=tmp_path / "t1", **common
    )
    fine = make_backend(tmp_path, bundles_dir, flood_path)
    async with serve(hog) as hog_url, serve(fine) as fine_url:
        async with client_for(hog_url) as hog_client, client_for(fine_url) as fine_client:
            flooder, victim = await asyncio.gather(
                hog_client.run_rollout(
                    initial_messages=[{"role": "user", "content": "use all the memory"}],
                    chat_completions_url=fake_chat.base_url,
                    rollout_id=f"hog-{uuid.uuid4().hex[:6]}",
                    llm_api_key="sk-hog",
                    grade=False,  # killed in its workflow: a verifier's sandbox would wait for nothing
                ),
                fine_client.run_rollout(
                    initial_messages=[{"role": "user", "content": "reply: echo 42"}],
                    chat_completions_url=fake_chat.base_url,
                    rollout_id=f"victim-{uuid.uuid4().hex[:6]}",
                    llm_api_key="sk-victim",
                    grade=False,
                ),
            )
    assert_victim_fine(victim)
    assert flooder.status is RolloutStatus.FAILURE
    assert flooder.err_category is RolloutErrorCategory.AGENT_ERROR, flooder.err_message
    assert "137" in flooder.err_message and "lost" not in flooder.err_message, flooder.err_message
    assert "its memory limit killed" in flooder.err_message and "(OOM)" in flooder.err_message, flooder.err_message


# Ways to fill the layer past its bound, each file within the file size limit (the bound): written,
# allocated without a write and past the file's size (which that limit does not see), and written
# to files deleted while held open (no walk of the layer sees them).
LAYER_FILLS = {
    "written": f"for i in 1 2 3 4; do dd if=/dev/zero of=/fill$i bs=1M count={DISK_MB}; done",
    "fallocated": f"touch /fill; fallocate --keep-size -l {4 * DISK_MB}M /fill; sleep 30",
    "held-deleted": (
        f"exec 3>/h1 4>/h2; rm /h1 /h2; dd if=/dev/zero bs=1M count={DISK_MB} >&3; "
        f"dd if=/dev/zero bs=1M count={DISK_MB} >&4; sleep 30"
    ),
}


@pytest.mark.parametrize(
    ("flood_path", "fill"),
    [("docker", fill) for fill in LAYER_FILLS] + [("skypilot-emulator", "written")],
    indirect=["flood_path"],
)
async def test_an_evicted_sandbox_is_listed_with_its_reason_until_terminated(flood_path: SdkPath, fill: str) -> None:
    """What the host reads after a command fails: ``ls`` keeps an evicted sandbox, as Kubernetes
    keeps an evicted pod, with kubelet's message (the emulator's status is SkyPilot's ``FAILED``),
    and terminating it ends that. Whichever way the layer was filled: each way on the Docker
    path; the emulator's path, whose server runs the same disk watch, reports one of them as
    SkyPilot would, the part that is its own."""
    sdk = load_sandbox_sdk(flood_path.name)
    image = push_to_local_registry(IMAGE) if flood_path.is_emulator else IMAGE
    name = f"evicted-{uuid.uuid4().hex[:8]}"
    sandbox = await sdk.create.aio(name=name, image=image, timeout=600)
    try:
        handle = await sandbox.exec.aio("sh", "-c", LAYER_FILLS[fill], timeout_seconds=120)
        with contextlib.suppress(Exception):  # killed with its sandbox: an exit status or an error
            await handle.wait()
        state = await await_until(lambda: _gone_state(sdk, name), timeout=30, what="the eviction to be listed")
        assert state.status in ("evicted", "FAILED") and state.over_own_disk_bound, state
        assert f'ephemeral storage limit "{DISK_MB}Mi"' in (state.message or ""), state
    finally:
        await sandbox.terminate.aio(wait=True)
    assert (await sandbox_state(sdk, name)).status is None


async def _gone_state(sdk: object, name: str) -> SandboxState | None:
    state = await sandbox_state(sdk, name)  # type: ignore[arg-type]
    return state if state.status is not None and not state.live else None


def test_only_an_eviction_for_its_own_storage_is_the_workflows() -> None:
    """kubelet's messages: a container or pod past its own limit is the workflow's doing; the node
    running low is not, and neither is a sandbox that still runs."""
    own = [
        'Container sandbox exceeded its local ephemeral storage limit "64Mi". ',
        "Pod ephemeral local storage usage exceeds the total limit of containers 10Gi. ",
        inode_limit_message(20_001, 20_000),  # the local SDKs' own, in kubelet's form
    ]
    node = "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. "
    assert all(SandboxState(name="s", status="FAILED", message=m).over_own_disk_bound for m in own)
    assert not SandboxState(name="s", status="FAILED", message=node).over_own_disk_bound
    assert not SandboxState(name="s", status="running", message=own[0]).over_own_disk_bound
    assert not SandboxState(name="s", status="FAILED").over_own_disk_bound
