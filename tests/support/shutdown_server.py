"""A HarborBackend served the documented way (``osmosis_harbor.serving.server.serve``), as its own
process, so that tests can stop it with a real SIGTERM.

``python -m tests.support.shutdown_server --port P --pool NAME --grace S --delivery S --work DIR --bundles DIR``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.server import create_rollout_server

from osmosis_harbor.backend import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.serving.server import add_status_route, serve
from tests.support.common import FIXTURES, TASKS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--grace", type=float, required=True)
    parser.add_argument("--delivery", type=float, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--bundles", type=Path, required=True)
    args = parser.parse_args()
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=2),
        tasks_dir=TASKS / "template",
        task_mode="template",
        agent="rollout_fixtures.workflows:ListWorkflow",
        code_dir=FIXTURES / "rollout_project",
        bundles_dir=args.bundles,
        trials_dir=args.work / "trials",
        environment_config=environment_config("docker", pool=args.pool, pool_size=1),
    )
    app = create_rollout_server(backend=backend, lifespan=backend.prewarm_lifespan(), configure_logging=False)
    serve(
        add_status_route(app, backend),
        host="127.0.0.1",
        port=args.port,
        shutdown_grace_sec=args.grace,
        delivery_sec=args.delivery,
        log_level="info",
    )


if __name__ == "__main__":
    main()
