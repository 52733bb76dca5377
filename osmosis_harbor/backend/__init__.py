"""The rollout backend: ``HarborBackend`` runs each Osmosis rollout as one Harbor trial.

``harbor_backend`` is the class (the ``ExecutionBackend`` methods), ``options`` its
constructor options, ``plan`` the decisions made once per rollout, ``task_copies`` the task
copy a plan says, ``tracker`` where each rollout is, ``outcome`` the ``ExecutionOutcome`` built
from a finished trial, ``prewarming`` the backend's prewarm, ``serving_state`` its admission,
health and shutdown, ``workspace`` its temporary work root.
"""

from osmosis_harbor.backend.harbor_backend import HarborBackend

__all__ = ["HarborBackend"]
