"""Per-rollout chat endpoint credentials, held in host memory only.

Harbor serialises a trial's whole config (agent kwargs and env included) into the trial
directory. The rollout API key must never land in a retained file, so trials carry only
the rollout id; the harness agent looks the endpoint and key up here at run time and
hands them to the in-container process through its exec environment.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutCredentials:
    chat_completions_url: str
    api_key: str | None

    def __repr__(self) -> str:  # never print the key, even in a debugger or a log line
        return f"RolloutCredentials(chat_completions_url={self.chat_completions_url!r}, api_key=***)"


_STORE: dict[str, RolloutCredentials] = {}
_GUARD = threading.Lock()


def put(rollout_id: str, credentials: RolloutCredentials) -> None:
    with _GUARD:
        _STORE[rollout_id] = credentials


def get(rollout_id: str) -> RolloutCredentials | None:
    with _GUARD:
        return _STORE.get(rollout_id)


def drop(rollout_id: str) -> None:
    with _GUARD:
        _STORE.pop(rollout_id, None)
