"""Prewarm: everything a rollout would otherwise pay for on first traffic, done once.

``Warmer`` (``warmer.py``) does one prewarm: per environment group, the image, the agent setup's
proof (``AgentSetup``, ``setup_proof.py``) and the warm pool; ``PrewarmReport`` (``report.py``)
says what it did. A backend's ``Prewarming`` (``prewarming.py``) runs it in the backend's scope,
keeps what came of it in ``Prewarmed`` (``prewarmed.py``: the pools its rollouts claim from, the
tasks refused), resizes pools (``PoolAutoscaler``, ``autoscale.py``) and prewarms a server, before
it serves or while it serves (``Startup``, ``startup.py``). The command is ``cli/prewarm.py``.
"""

from __future__ import annotations

from osmosis_harbor.errors import PrewarmError
from osmosis_harbor.prewarm.report import PrewarmGroup, PrewarmReport
from osmosis_harbor.prewarm.warmer import ProgressCallback

__all__ = ["PrewarmError", "PrewarmGroup", "PrewarmReport", "ProgressCallback"]
