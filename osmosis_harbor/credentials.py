"""The rollout API key in host memory: per-rollout credentials, owned by a backend.

Trials carry only the rollout id (Harbor serialises a trial's whole config into its directory);
the workflow agent looks the endpoint and key up in its owner's store at run time
(``sandbox.owner.context.SandboxOwner.credentials``: a backend's, a validation run's), so two
backends that see the same rollout id never read or drop each other's key. ``key_custody.py`` covers the
key on disk.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["CredentialStore", "RolloutCredentials"]


@dataclass(frozen=True)
class RolloutCredentials:
    """The rollout's endpoint and key; ``sandbox_url`` is the endpoint as the sandbox reaches
    it when that differs (the policy relay's URL for an endpoint on the host's loopback)."""

    chat_completions_url: str
    api_key: str | None
    sandbox_url: str | None = None

    def __repr__(self) -> str:  # never print the key, even in a debugger or a log line
        return f"RolloutCredentials(chat_completions_url={self.chat_completions_url!r}, api_key=***, sandbox_url=***)"


class CredentialStore:
    """The endpoints and keys of one owner's running rollouts (a backend's, a validation run's).

    Keyed by rollout id within the owner only: two backends in one process that see the same
    rollout id each keep their own; the workflow agent finds its owner's (``context.current_owner``)."""

    def __init__(self) -> None:
        self._held: dict[str, RolloutCredentials] = {}
        self._guard = threading.Lock()

    def hold(self, rollout_id: str, credentials: RolloutCredentials) -> None:
        with self._guard:
            self._held[rollout_id] = credentials

    def get(self, rollout_id: str) -> RolloutCredentials | None:
        with self._guard:
            return self._held.get(rollout_id)

    def drop(self, rollout_id: str) -> None:
        with self._guard:
            self._held.pop(rollout_id, None)
