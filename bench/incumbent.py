"""``python -m bench --only incumbent``: ours beside osmosis-ai 0.3.8's own Harbor backend, one run.

Why: how far ours is from the incumbent (``osmosis_ai.rollout.backend.harbor``) on the same
engine and workload, against the targets: host CPU per rollout (at most 0.15x), sequential latency
(at most 0.20x) and throughput at concurrency 4 (at least 5x). Ratios only mean something
from one run on one machine, so both backends run here, one after the other, each served by
the real osmosis server in a process of its own (``bench.server_proc``).

The workload: the scale benchmark's graded rollout (a chat call plus the fixture project's
Osmosis grader, ``AnswerGrader``) on the template task without tests, built from the same
fixture project, on the same Docker engine. Per backend: two warm-up rollouts (image build,
bundle), ``SEQUENTIAL`` rollouts one after the other (submit to result, the latency), then
``BATCH`` rollouts at concurrency 4 (rollouts per second of wall time, and the server's
utime + stime over the batch per rollout). Ours runs twice: as it starts with no pool (the
headline ratios), and as the README recommends serving it, prewarmed with a warm pool
(``ours-pool``, ``POOL_SIZE`` members; both of a graded rollout's sandboxes are claimed).

What "the same engine" takes for the incumbent, exactly:

* osmosis-ai 0.3.8 pins ``harbor<0.25``; this environment has Harbor 0.25, which dropped the
  one name the incumbent imports and 0.25 lacks, ``harbor.trial.network_policy.
  resolve_agent_phase_policy``. ``_harbor_024_compat`` re-creates it from Harbor 0.25's own
  pieces, exactly as 0.24 defines it (the incumbent calls it with no extra hosts, where it is
  the task's explicit agent policy or the baseline). Nothing else of the incumbent is touched.
* Its Dockerfile patch copies uv from ``ghcr.io/astral-sh/uv:latest`` (unreachable here):
  ``ensure_uv_image`` makes a local image of that name from the uv binary of its own pin. The
  patch then asks uv for Python 3.12, which no local image has (the ``python:3.12-slim``
  stand-in is Debian trixie's 3.13, uv downloads are off): ``_preinstall_sdk`` writes the same
  patch into the task with the image's own Python, and the incumbent runs with its
  ``patch_dockerfile_with_sdk=False``, so each trial installs only the wheel, as patched.
* Its own environments cannot run here: Harbor's ``docker`` needs the docker compose v2
  plugin (absent), Harbor's ``skypilot`` needs ``sky.sandbox`` (absent). So its trials run in
  a plain reference environment on the same engine, on docker-py's defaults
  (``bench.reference_environment``), which shares nothing with our sandbox layer: our cuts
  there do not lower its column. Its containers are on docker-py's default network (the
  engine's default bridge), each in a network namespace of its own as on either of its real
  environments, and the incumbent has no policy relay: its scripted policy (the same replies)
  listens on that bridge's gateway. Ours runs as it ships (its sandboxes' bridge, the chat call
  through our relay, whose CPU is in our server's figure).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harbor.models.trial.config import EnvironmentConfig
from harbor.trial.queue import TrialQueue

from osmosis_harbor.testing.scripted_policy import FakeChatServer

from .common import BenchResult
from .env import GR, PROJECT, WF, grader_task, workdir
from .reference_environment import IMPORT_PATH as REFERENCE_ENVIRONMENT
from .reference_environment import default_bridge_gateway
from .server_proc import ServerProcess, ServerSpec
from .soak import controller
from .workload import GRADED_PROMPT, submit_rollout

NAME = "incumbent"
TITLE = "ours beside osmosis-ai 0.3.8's Harbor backend: CPU per rollout, sequential latency, throughput at 4"
CONCURRENCY = 4
BACKENDS = ("incumbent", "ours", "ours-pool")
# ``ours-pool``: ours as the README recommends serving it, prewarmed with a warm pool per
# environment group (both of a graded rollout's sandboxes are claimed from it).
POOL_SIZE = 2 * CONCURRENCY
UV_IMAGE = "ghcr.io/astral-sh/uv:latest"


@dataclass(frozen=True)
class Sizes:
    sequential: int
    batch: int


def sizes(quick: bool) -> Sizes:
    return Sizes(sequential=3, batch=8) if quick else Sizes(sequential=5, batch=16)


@dataclass
class Figures:
    """One backend's figures from this run."""

    latency_sec: list[float] = field(default_factory=list)
    cpu_per_rollout_s: float = float("nan")
    machine_cpu_per_rollout_s: float = float("nan")
    throughput_per_s: float = float("nan")
    failed: int = 0


def _harbor_024_compat() -> None:
    """Harbor 0.24's ``resolve_agent_phase_policy``, which osmosis-ai 0.3.8 imports (see the
    module docstring), from Harbor 0.25's own helpers; a no-op where Harbor still has it."""
    from harbor.trial import network_policy as np

    if hasattr(np, "resolve_agent_phase_policy"):
        return

    def resolve_agent_phase_policy(task_cfg: Any, trial_agent_cfg: Any, agent_env_baseline: Any, step_cfg: Any = None):  # type: ignore[no-untyped-def]
        explicit = np._explicit_phase_policy(task_cfg, step_cfg, "agent")
        extra_hosts = np.normalize_allowed_hosts(list(trial_agent_cfg.extra_allowed_hosts))
        policy = explicit or agent_env_baseline
        return np.merge_extra_allowlists(policy, extra_hosts) if extra_hosts else policy

    np.resolve_agent_phase_policy = resolve_agent_phase_policy  # type: ignore[attr-defined]


def ensure_uv_image() -> None:
    """The incumbent's Dockerfile patch copies ``/uv`` from ``ghcr.io/astral-sh/uv:latest``, a
    registry this machine cannot reach; a locally present image of that name satisfies it (as
    locally made base images satisfy ``FROM``). Made once from the uv binary the incumbent's own
    ``harbor`` extra installs beside this interpreter (``uv>=0.13.4,<0.14``)."""
    import io
    import shutil as sh
    import tarfile

    import docker
    import docker.errors

    api = docker.from_env().api
    try:
        api.inspect_image(UV_IMAGE)
        return
    except docker.errors.ImageNotFound:
        pass
    uv = Path(sys.executable).parent / "uv"
    if not uv.is_file():
        found = sh.which("uv")
        if found is None:
            raise RuntimeError("the incumbent needs uv: pip install 'uv>=0.13.4,<0.14' (osmosis-ai[harbor] pins it)")
        uv = Path(found)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(uv, arcname="uv")
    repository, tag = UV_IMAGE.rsplit(":", 1)
    api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)


def make_incumbent(spec: ServerSpec) -> Any:
    """osmosis-ai 0.3.8's ``HarborBackend`` on the graded template task, the fixture project's
    workflow and grader, in the reference Docker environment (docker-py's default network)."""
    _harbor_024_compat()
    ensure_uv_image()
    # Its bundler runs ``uv build``, which looks for a Python from the working directory (a .venv
    # there or above, else PATH, where this machine's default is 3.11 and uv would download one):
    # from a checkout without a .venv that failed offline. This interpreter is the one to use.
    os.environ.setdefault("UV_PYTHON", sys.executable)
    # Imported only once the 0.24 name it needs is back in Harbor's module.
    from osmosis_ai.rollout.backend.harbor import HarborBackend as IncumbentBackend

    if str(PROJECT) not in sys.path:  # the incumbent imports the workflow and grader classes
        sys.path.insert(0, str(PROJECT))
    task = grader_task(spec.work)
    backend = IncumbentBackend(
        orchestrator=TrialQueue(n_concurrent=spec.n_concurrent),
        tasks_dir=task,
        patch_dockerfile_with_sdk=False,  # done below, as its patch does, with the image's Python
        agent=f"{WF}:ListWorkflow",
        workflow_config=f"{WF}:fixture_config",
        grader=f"{GR}:AnswerGrader",
        grader_config=f"{GR}:fixture_grader_config",
        code_dir=PROJECT,
        environment_config=EnvironmentConfig(import_path=REFERENCE_ENVIRONMENT),
        trials_dir=spec.work / "trials",
        cleanup_successful_trials=True,
    )
    _preinstall_sdk(task / "environment", list(backend.bundle.requirements))
    return backend


async def dispose_incumbent(backend: Any) -> None:
    """Shut the incumbent down and remove the work root it made for itself: it keeps its
    per-rollout copies in ``$TMPDIR/osmosis-harbor-<tasks dir name>`` (its trials are in the
    bench's work dir) and leaves that directory behind after ``shutdown``."""
    await backend.shutdown()
    shutil.rmtree(backend.rollouts_dir.parent, ignore_errors=True)


def _preinstall_sdk(env_dir: Path, requirements: list[str]) -> None:
    """The incumbent's own Dockerfile patch (``tasks.patch_dockerfile_with_sdk``: uv, then the
    bundle's requirements in a venv at /opt/osmosis/venv, so each trial installs only the wheel,
    ``--no-deps``), except for the venv's Python: its patch asks uv for 3.12, and the local
    stand-in for ``python:3.12-slim`` is Debian trixie's 3.13 (uv downloads are off here)."""
    from osmosis_ai.rollout.backend.harbor.tasks import SDK_REQUIREMENTS_FILENAME, SDK_UV, SDK_VENV

    (env_dir / SDK_REQUIREMENTS_FILENAME).write_text("\n".join(requirements) + "\n")
    block = [
        "USER root",
        f"COPY --from={UV_IMAGE} /uv {SDK_UV}",
        f"COPY {SDK_REQUIREMENTS_FILENAME} /opt/osmosis/requirements.txt",
        f"RUN {SDK_UV} venv {SDK_VENV} --python python3 && "
        f"{SDK_UV} pip install --python {SDK_VENV}/bin/python -r /opt/osmosis/requirements.txt",
    ]
    dockerfile = env_dir / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().rstrip("\n") + "\n" + "\n".join(block) + "\n")


async def measure(backend: str, work: Path, chat: FakeChatServer, size: Sizes) -> Figures:
    figures = Figures()
    spec = ServerSpec(
        Path(tempfile.mkdtemp(prefix=f"{backend}-", dir=work)),
        n_concurrent=CONCURRENCY,
        graded=True,
        pool_size=POOL_SIZE if backend == "ours-pool" else 0,
    )
    if backend == "incumbent":
        spec = dataclasses.replace(spec, make=make_incumbent, dispose=dispose_incumbent)
    total = 2 + size.sequential + size.batch
    async with ServerProcess(spec) as server, controller(server.url, total) as client:

        async def one() -> bool:
            return await submit_rollout(client, chat.base_url, GRADED_PROMPT, grade=True, timeout=None)

        oks = [await one() for _ in range(2)]  # warm-ups: image build, bundle, first imports
        for _ in range(size.sequential):
            t0 = time.monotonic()
            oks.append(await one())
            figures.latency_sec.append(time.monotonic() - t0)
        cpu0, machine0, t0 = server.cpu_sec(), machine_cpu_sec(), time.monotonic()
        oks += await asyncio.gather(*(one() for _ in range(size.batch)))
        wall, spent = time.monotonic() - t0, server.cpu_sec() - cpu0
        machine = machine_cpu_sec() - machine0
    figures.cpu_per_rollout_s = spent / size.batch
    figures.machine_cpu_per_rollout_s = machine / size.batch
    figures.throughput_per_s = size.batch / wall
    figures.failed = oks.count(False)
    return figures


def machine_cpu_sec() -> float:
    """The whole machine's busy CPU time so far (``/proc/stat``: every core's user, nice,
    system, irq, softirq and steal time), in seconds: the server, the engine and the sandboxes
    alike, which is what bounds throughput on a machine whose cores the sandboxes share."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def report(result: BenchResult, by: dict[str, Figures]) -> None:
    inc, ours, pooled = by["incumbent"], by["ours"], by["ours-pool"]
    for name, f in by.items():
        result.add(f"{name}: host CPU per graded rollout, concurrency {CONCURRENCY}", "s", [f.cpu_per_rollout_s])
        result.add(f"{name}: sequential latency, submit to result", "s", f.latency_sec)
        result.add(f"{name}: throughput at concurrency {CONCURRENCY}", "rollouts/s", [f.throughput_per_s])
        result.add(
            f"{name}: machine CPU per graded rollout (server, engine, sandboxes)", "s", [f.machine_cpu_per_rollout_s]
        )
        if f.failed:
            result.warn(f"{name}: {f.failed} rollout(s) did not succeed")
    ratios = {
        "cpu_ratio": ours.cpu_per_rollout_s / inc.cpu_per_rollout_s,
        "latency_ratio": statistics.median(ours.latency_sec) / statistics.median(inc.latency_sec),
        "throughput_ratio": ours.throughput_per_s / inc.throughput_per_s,
    }
    pooled_ratios = {
        "pool_cpu_ratio": pooled.cpu_per_rollout_s / inc.cpu_per_rollout_s,
        "pool_latency_ratio": statistics.median(pooled.latency_sec) / statistics.median(inc.latency_sec),
        "pool_throughput_ratio": pooled.throughput_per_s / inc.throughput_per_s,
    }
    for key, value in {**ratios, **pooled_ratios}.items():
        result.headline_value(key, value)
    result.headline_value("ours_cpu_per_rollout_s", ours.cpu_per_rollout_s)
    result.headline_value("incumbent_cpu_per_rollout_s", inc.cpu_per_rollout_s)
    result.info.update(
        {
            "ours/incumbent host CPU per rollout (target <= 0.15)": round(ratios["cpu_ratio"], 3),
            "ours/incumbent sequential latency (target <= 0.20)": round(ratios["latency_ratio"], 3),
            "ours/incumbent throughput at 4 (target >= 5)": round(ratios["throughput_ratio"], 2),
            "with a warm pool: ours/incumbent host CPU per rollout": round(pooled_ratios["pool_cpu_ratio"], 3),
            "with a warm pool: ours/incumbent sequential latency": round(pooled_ratios["pool_latency_ratio"], 3),
            "with a warm pool: ours/incumbent throughput at 4": round(pooled_ratios["pool_throughput_ratio"], 2),
        }
    )


async def run(quick: bool) -> BenchResult:
    size = sizes(quick)
    result = BenchResult(NAME, TITLE)
    work = workdir(NAME)
    chat = FakeChatServer(default_reply="true")
    bridged = FakeChatServer(default_reply="true", host=default_bridge_gateway())  # the incumbent's
    try:
        by = {
            backend: await measure(backend, work, bridged if backend == "incumbent" else chat, size)
            for backend in BACKENDS
        }
        report(result, by)
    finally:
        chat.close()
        bridged.close()
        shutil.rmtree(work, ignore_errors=True)
    return result
