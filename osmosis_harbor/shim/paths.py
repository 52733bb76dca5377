"""Where the shim reads and writes inside the sandbox.

Every location has a production default (the Harbor layout: ``/logs`` is
collected by Harbor, ``/tests`` only appears at verification time) and an
environment-variable override, so the same code runs unchanged on a host in
tests. Nothing here touches the filesystem.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.rollout.context import API_KEY_ENV, CHAT_COMPLETIONS_URL_ENV

# Inputs staged by the host.
ROLLOUT_INPUT_ENV = "OSMOSIS_ROLLOUT_INPUT"
DEFAULT_ROLLOUT_INPUT = "/osmosis/rollout_input.json"
GRADING_INPUT_ENV = "OSMOSIS_GRADING_INPUT"
DEFAULT_GRADING_INPUT = "/tests/osmosis_grading_input.json"
LOGS_DIR_ENV = "OSMOSIS_LOGS_DIR"
DEFAULT_LOGS_DIR = "/logs"

# Secrets and endpoints: environment only, never files (re-exported from
# osmosis_ai so the names cannot drift from what RolloutContext reads).
CHAT_URL_ENV = CHAT_COMPLETIONS_URL_ENV
KEY_ENV = API_KEY_ENV

# Deadlines in seconds (floats); unset or empty means unbounded.
AGENT_TIMEOUT_ENV = "OSMOSIS_AGENT_TIMEOUT_SEC"
GRADER_TIMEOUT_ENV = "OSMOSIS_GRADER_TIMEOUT_SEC"

SAMPLE_FILENAME = "sample.json"
REWARD_FILENAME = "reward.json"
ERROR_FILENAME = "error.json"
TRAJECTORY_FILENAME = "trajectory.json"


@dataclass(frozen=True)
class ShimPaths:
    """Resolved file locations for one shim invocation."""

    logs_dir: Path
    rollout_input: Path
    grading_input: Path

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
        env = os.environ if env is None else env
        return cls(
            logs_dir=Path(logs_dir or env.get(LOGS_DIR_ENV) or DEFAULT_LOGS_DIR),
            rollout_input=Path(
                rollout_input or env.get(ROLLOUT_INPUT_ENV) or DEFAULT_ROLLOUT_INPUT
            ),
            grading_input=Path(
                grading_input or env.get(GRADING_INPUT_ENV) or DEFAULT_GRADING_INPUT
            ),
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
