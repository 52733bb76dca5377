"""The host <-> sandbox contract: the one definition both sides import.

The host (``osmosis_harbor.agents``, ``tasks``, ``backend``) stages files and sets variables
by these names; the shim, in the sandbox, reads them, and writes its products where the host
reads them back. The shim ships inside every bundle wheel, so this module imports only the
standard library and ``osmosis_ai``. It is also the one module of the shim that reads the
process environment (``environ``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from osmosis_ai.rollout.context import API_KEY_ENV, CHAT_COMPLETIONS_URL_ENV

# ── paths in the sandbox ─────────────────────────────────────────────────────
LOGS_DIR = "/logs"  # Harbor downloads /logs/agent and /logs/verifier into the trial directory
AGENT_LOGS = f"{LOGS_DIR}/agent"
VERIFIER_LOGS = f"{LOGS_DIR}/verifier"
ARTIFACTS_LOGS = f"{LOGS_DIR}/artifacts"
# Harbor's in-sandbox log dirs. An image with the bundle baked in holds them empty and
# world-writable (the Dockerfile patch makes them), which is what Harbor's own preparation
# commands would do on a fresh sandbox: the sandbox environment skips those commands there.
LAYOUT_DIRS = (AGENT_LOGS, VERIFIER_LOGS, ARTIFACTS_LOGS)
BAKED_BUNDLE_COMMENT = "# osmosis-harbor baked bundle: "  # + the key, in the patched Dockerfile
ROLLOUT_INPUT_DIR = "/osmosis"
ROLLOUT_INPUT = f"{ROLLOUT_INPUT_DIR}/rollout_input.json"  # id, prompt, metadata: never the label
TESTS_DIR = "/tests"  # uploaded by Harbor only for verification
GRADING_INPUT_FILENAME = "osmosis_grading_input.json"
GRADING_INPUT = f"{TESTS_DIR}/{GRADING_INPUT_FILENAME}"
BUNDLE_ROOT = "/opt/osmosis"
VENV = f"{BUNDLE_ROOT}/venv"  # the bundle's own venv: the image's Python and user are left alone
WHEELS_DIR = f"{BUNDLE_ROOT}/wheels"
CONTAINER_REQUIREMENTS = f"{BUNDLE_ROOT}/requirements.txt"  # baked into the image by the Dockerfile patch
# The key of the bundle baked into the image (one line): a trial checks it instead of installing.
BUNDLE_MARKER = f"{BUNDLE_ROOT}/bundle.id"
# The verifier guard baked into the image (osmosis_harbor/sandbox/guard), and its bytes' sha256
# after this comment in the patched Dockerfile; without it, the host uploads the guard.
GUARD_PATH = f"{BUNDLE_ROOT}/guard"
BAKED_GUARD_COMMENT = "# osmosis-harbor baked guard: "

# ── files the shim writes (under agent/ and verifier/) ───────────────────────
SAMPLE_FILENAME = "sample.json"
REWARD_FILENAME = "reward.json"
ERROR_FILENAME = "error.json"
TRAJECTORY_FILENAME = "trajectory.json"

# ── the Python a bundle needs, and how an image that lacks it is reported ────
MIN_PYTHON = (3, 12)
EXIT_NO_PYTHON = 90  # the task image has no python3
EXIT_OLD_PYTHON = 91  # its python3 is older than MIN_PYTHON
IMAGE_PROBLEM_EXITS = frozenset({EXIT_NO_PYTHON, EXIT_OLD_PYTHON})
EXIT_WRONG_BUNDLE = 93  # the image's BUNDLE_MARKER names another bundle (or none)
WRONG_BUNDLE_MESSAGE = "osmosis-harbor: wrong bundle in the sandbox image"  # starts the check's stderr line

# ── environment variables (the key and endpoint travel only here, never in files) ──
ROLLOUT_INPUT_ENV = "OSMOSIS_ROLLOUT_INPUT"
# The rollout input itself, as JSON, when it is small: it rides the workflow's own exec instead of
# costing an upload (a round trip to the sandbox API). Larger inputs go as a file.
ROLLOUT_INPUT_JSON_ENV = "OSMOSIS_ROLLOUT_INPUT_JSON"
INLINE_INPUT_MAX_BYTES = 64 * 1024  # well under Linux's 128 KiB limit on one environment string
ROLLOUT_ID_ENV = "OSMOSIS_ROLLOUT_ID"
GRADING_INPUT_ENV = "OSMOSIS_GRADING_INPUT"
LOGS_DIR_ENV = "OSMOSIS_LOGS_DIR"
CHAT_URL_ENV = CHAT_COMPLETIONS_URL_ENV  # osmosis_ai's names, so they cannot drift from RolloutContext
KEY_ENV = API_KEY_ENV
AGENT_TIMEOUT_ENV = "OSMOSIS_AGENT_TIMEOUT_SEC"  # seconds (float); unset or empty: unbounded
GRADER_TIMEOUT_ENV = "OSMOSIS_GRADER_TIMEOUT_SEC"


def environ(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The environment the shim reads: ``env`` when given (tests), else the process's own."""
    return os.environ if env is None else env
