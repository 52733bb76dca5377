"""Where the shim reads and writes inside the sandbox.

Every location has a production default (``contract``: ``/logs`` is collected
by Harbor, ``/tests`` only appears at verification time) and an
environment-variable override, so the same code runs unchanged on a host in
tests. Nothing here touches the filesystem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .contract import (
    AGENT_TIMEOUT_ENV,
    CHAT_URL_ENV,
    ERROR_FILENAME,
    GRADER_TIMEOUT_ENV,
    GRADING_INPUT,
    GRADING_INPUT_ENV,
    KEY_ENV,
    LOGS_DIR,
    LOGS_DIR_ENV,
    REWARD_FILENAME,
    ROLLOUT_INPUT,
    ROLLOUT_INPUT_ENV,
    ROLLOUT_INPUT_JSON_ENV,
    SAMPLE_FILENAME,
    TRAJECTORY_FILENAME,
    environ,
)

__all__ = ["AGENT_TIMEOUT_ENV", "CHAT_URL_ENV", "GRADER_TIMEOUT_ENV", "KEY_ENV", "ShimPaths"]


@dataclass(frozen=True)
class ShimPaths:
    """Resolved file locations for one shim invocation."""

    logs_dir: Path
    rollout_input: Path
    grading_input: Path
    rollout_input_json: str | None = None  # the input itself, when the host sent it inline

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        logs_dir: str | Path | None = None,
        rollout_input: str | Path | None = None,
        grading_input: str | Path | None = None,
    ) -> ShimPaths:
        """Explicit arguments win over environment variables, which win over defaults."""
        env = environ(env)
        return cls(
            logs_dir=Path(logs_dir or env.get(LOGS_DIR_ENV) or LOGS_DIR),
            rollout_input=Path(rollout_input or env.get(ROLLOUT_INPUT_ENV) or ROLLOUT_INPUT),
            grading_input=Path(grading_input or env.get(GRADING_INPUT_ENV) or GRADING_INPUT),
            rollout_input_json=None if rollout_input else env.get(ROLLOUT_INPUT_JSON_ENV) or None,
        )

    @property
    def agent_dir(self) -> Path:
        return self.logs_dir / "agent"

    @property
    def verifier_dir(self) -> Path:
        return self.logs_dir / "verifier"

    @property
    def artifacts_dir(self) -> Path:
        """Harbor collects ``/logs/artifacts``; it is ``ctx.artifacts_dir``."""
        return self.logs_dir / "artifacts"

    @property
    def agent_sample(self) -> Path:
        return self.agent_dir / SAMPLE_FILENAME

    @property
    def agent_error(self) -> Path:
        return self.agent_dir / ERROR_FILENAME

    @property
    def agent_trajectory(self) -> Path:
        return self.agent_dir / TRAJECTORY_FILENAME

    @property
    def verifier_sample(self) -> Path:
        return self.verifier_dir / SAMPLE_FILENAME

    @property
    def verifier_reward(self) -> Path:
        return self.verifier_dir / REWARD_FILENAME

    @property
    def verifier_error(self) -> Path:
        return self.verifier_dir / ERROR_FILENAME
