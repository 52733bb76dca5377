"""The policy relay: a sandbox reaches its rollout's chat endpoint through the host, within bounds."""
