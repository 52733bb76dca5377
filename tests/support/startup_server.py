"""A HarborBackend that prewarms while it serves (``prewarm_lifespan(background=True)``), served
the documented way (``serve``) as its own process, so that tests can watch its start-up from
outside and stop it with a real SIGTERM.

``python -m tests.support.startup_server --port P --tasks DIR --task ID ... --work DIR [--sdk NAME]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.server import create_rollout_server

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.serving.server import serve
from tests.support.common import FIXTURES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--task", action="append", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--sdk", default="docker")
    args = parser.parse_args()
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=2),
        tasks_dir=args.tasks,
        task_mode="dataset",
        agent="rollout_fixtures.workflows:ListWorkflow",
        code_dir=FIXTURES / "rollout_project",
        trials_dir=args.work / "trials",
        environment_config=environment_config(args.sdk),
    )
    app = create_rollout_server(
        backend=backend, lifespan=backend.prewarm_lifespan(args.task, background=True), configure_logging=False
    )
    serve(app, host="127.0.0.1", port=args.port, shutdown_grace_sec=5, delivery_sec=1)


if __name__ == "__main__":
    main()
