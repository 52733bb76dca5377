"""The same workflow and grader under osmosis-ai's LocalBackend, in the server's own process:
the comparison `configs/eval/calc-local.toml` runs. The policy's commands then run on this
machine, not in a sandbox: use it only with a policy you trust."""

from osmosis_ai.rollout.backend.local.backend import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server

from osmosis_harbor.serving.server import serve

backend = LocalBackend(
    workflow="calc_rollout.workflow:CalcWorkflow",
    workflow_config="calc_rollout.workflow:calc_config",
    grader="calc_rollout.grader:CalcGrader",
    grader_config="calc_rollout.grader:calc_grader_config",
)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    serve(app)
