"""The rollout server `osmosis eval run` starts: every rollout runs in a sandbox of its own.

The workflow runs in one sandbox, the grader in a fresh one (so a policy cannot write its own
reward); both are built from this directory as a bundle wheel. `CALC_SANDBOXES` (set in
configs/eval/calc.toml's [env]) picks the sandboxes: "docker" (this machine's Docker engine),
"skypilot-emulator" (SkyPilot's SDK served locally) or "skypilot" (SkyPilot Sandboxes).
"""

import os
from pathlib import Path

from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.server import create_rollout_server

from osmosis_harbor import HarborBackend
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.serving.server import add_status_route, serve

HERE = Path(__file__).resolve().parent

backend = HarborBackend(
    orchestrator=TrialQueue(n_concurrent=3),  # rollouts at once; the harness sends as many
    tasks_dir=HERE / "task",
    task_mode="template",  # each dataset row's prompt becomes the task's instruction
    agent="calc_rollout.workflow:CalcWorkflow",
    workflow_config="calc_rollout.workflow:calc_config",
    grader="calc_rollout.grader:CalcGrader",
    grader_config="calc_rollout.grader:calc_grader_config",
    code_dir=HERE,
    environment_config=environment_config(os.environ.get("CALC_SANDBOXES", "docker")),
)
# background=True: /health answers while the first image builds (the harness waits 90 s for it).
app = add_status_route(
    create_rollout_server(backend=backend, lifespan=backend.prewarm_lifespan(background=True)), backend
)

if __name__ == "__main__":
    serve(app)  # on $_OSMOSIS_ROLLOUT_PORT, which the harness picks; SIGTERM drains, then exits
