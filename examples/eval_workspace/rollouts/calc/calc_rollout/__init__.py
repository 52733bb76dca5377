"""An arithmetic rollout: the policy answers with a shell command, the sandbox runs it."""
