"""The agents a rollout's trial runs: the Osmosis workflow bundle (``workflow``) or one of
Harbor's native agents wired to the rollout's endpoint (``native``)."""
