"""The rollout backend: ``HarborBackend`` runs each Osmosis rollout as one Harbor trial.

``harbor_backend`` is the class (the ``ExecutionBackend`` methods), ``options`` its
constructor options, ``plan`` the decisions made once per rollout, ``tracker`` where each
rollout is, ``outcome`` the ``ExecutionOutcome`` built from a finished trial, ``lifecycle``
prewarm, health and shutdown.
"""

from osmosis_harbor.backend.harbor_backend import HarborBackend

__all__ = ["HarborBackend"]
