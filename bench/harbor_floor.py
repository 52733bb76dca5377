"""Harbor's own host CPU per trial: the floor under any rollout that runs as a Harbor trial.

Why: the target is 0.03 s of host CPU per rollout. A rollout is a trial of Harbor's real
``TrialQueue`` and ``Trial``, which load the task, write its lock, hash it, set up logging and
write results whatever the sandbox does. This measures that share alone: trials of the repo's
``hello-reward-txt`` task with the oracle agent, on ``bench.null_environment`` (no sandbox, no
SDK, no agent work), at concurrency 4, after four warm-up trials.

It runs twice, each in a fresh process (``python -m bench.harbor_floor N on|off``) so neither
inherits the other's patched functions: with Harbor as shipped (the baseline) and with our
fast paths for its per-trial task checks (``osmosis_harbor.harbor_compat.fastpaths``), which
every rollout of ours runs with. The process's utime + stime over the batch, per trial.
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .env import REPO

TASK = REPO / "tasks" / "hello-reward-txt"
CONCURRENCY = 4
WARM_UP = 4


def _cpu_sec() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _trials(n: int, trials_dir: Path, tag: str) -> int:
    """``n`` trials through one ``TrialQueue``; how many came back with a reward of 1."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.queue import TrialQueue

    queue = TrialQueue(n_concurrent=CONCURRENCY)
    configs = [
        TrialConfig(
            task=TaskConfig(path=TASK),
            trial_name=f"{tag}-{index}",
            trials_dir=trials_dir,
            agent=AgentConfig(name="oracle"),
            environment=EnvironmentConfig(import_path="bench.null_environment:NullEnvironment"),
        )
        for index in range(n)
    ]
    results = await asyncio.gather(*(queue.submit(config) for config in configs))
    return sum(
        1 for r in results if r.verifier_result is not None and (r.verifier_result.rewards or {}).get("reward") == 1
    )


async def _measure_here(n: int, fastpaths: bool, without: tuple[str, ...] = ()) -> dict[str, float | int | list[str]]:
    installed: tuple[str, ...] = ()
    if fastpaths:
        from osmosis_harbor import settings
        from osmosis_harbor.harbor_compat import fastpaths as harbor_fastpaths

        harbor_fastpaths.install(settings.current())
        harbor_fastpaths.uninstall(without)
        installed = harbor_fastpaths.installed()
    trials_dir = Path(tempfile.mkdtemp(prefix="osmosis-bench-harbor-floor-"))
    try:
        await _trials(WARM_UP, trials_dir, "warm")
        before = _cpu_sec()
        rewarded = await _trials(n, trials_dir, "floor")
        spent = _cpu_sec() - before
    finally:
        shutil.rmtree(trials_dir, ignore_errors=True)
    return {"cpu_per_trial_s": spent / n, "trials": n, "rewarded": rewarded, "fastpaths": list(installed)}


def measure(n: int, *, fastpaths: bool, without: tuple[str, ...] = ()) -> dict[str, float | int | list[str]]:
    """Run the batch in a child process; its figures. Raises if a trial did not reward 1.
    ``without``: fast-path labels left out (Harbor's own kept), to measure one group's share."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.harbor_floor", str(n), "on" if fastpaths else "off", ",".join(without)],
        cwd=REPO,  # `python -m` puts it on sys.path: Harbor imports bench.null_environment from there
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"bench.harbor_floor exited {completed.returncode}: {completed.stderr[-2000:]}")
    figures: dict[str, float | int | list[str]] = json.loads(completed.stdout.strip().splitlines()[-1])
    if figures["rewarded"] != n:
        raise RuntimeError(f"bench.harbor_floor: {figures['rewarded']} of {n} null-environment trials rewarded 1")
    return figures


if __name__ == "__main__":
    count, switch = int(sys.argv[1]), sys.argv[2]
    left_out = tuple(label for label in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if label)
    print(json.dumps(asyncio.run(_measure_here(count, switch == "on", left_out))))
