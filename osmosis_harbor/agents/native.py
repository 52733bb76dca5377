"""Harbor's native agents (``terminus-2``, ``mini-swe-agent``, ``oracle``) as rollout agents.

Two jobs:

* ``native_agent_config`` builds the Harbor ``AgentConfig`` that points a native agent at
  the rollout's OpenAI-compatible chat endpoint: ``base_url`` (the endpoint),
  ``model_name``, ``model_api_format=openai_chat_completions`` and the *name* of an
  environment variable that holds the key. The wiring is applied after the user's
  ``native_agent_kwargs`` and always wins; a kwarg that tried to change it is dropped
  with a ``NativeAgentWiringWarning``.
* ``sample_from_trajectory`` turns the agent's ATIF trajectory (``agent/trajectory.json``
  in the trial dir) into an Osmosis ``RolloutSample`` with OpenAI chat-shaped messages.

The API key never enters the ``AgentConfig``: Harbor writes the whole config (kwargs and
env included) to ``config.json`` / ``result.json`` in the trial dir. Harbor reads a key
only from an environment variable, either ``AgentConfig.env`` (serialized; and for
terminus-2 exported into the sandbox's tmux shell, where the policy's commands run) or
the host process environment. So the key lives in the host environment under a name
that is unique to one rollout (``scoped_api_key``), for exactly the duration of that
rollout's trial:

* terminus-2 runs its LLM client (LiteLLM) on the host. ``model_api_key_name`` names the
  scoped variable; Harbor resolves it from ``os.environ`` when it builds the agent and
  hands the value to LiteLLM as ``api_key`` (memory only). Nothing reaches the sandbox.
* mini-swe-agent runs LiteLLM inside the sandbox. ``AgentConfig.env`` carries the
  *template* ``{"OPENAI_API_KEY": "${<scoped name>}"}`` (serialized as the template, never
  the value); Harbor resolves it from the host environment when it builds the agent and
  passes it to the sandbox only as the exec environment of the agent's commands. (With
  ``model_api_key_name`` Harbor would also put the key into mini-swe-agent's own config,
  which mini-swe-agent saves in its trajectory file: avoided on purpose.)
"""

from __future__ import annotations

import copy
import logging
import os
import re
import sys
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import yaml
from harbor.models.model_api_format import ModelApiFormat
from harbor.models.trial.config import AgentConfig
from osmosis_ai.rollout.types import RolloutSample

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError, ContractFileError
from osmosis_harbor.shim.atif import TrajectoryError, sample_from_atif
from osmosis_harbor.trials.contract_files import ContractBounds, FileKind, read_json

__all__ = [
    "DEFAULT_MODEL_NAME",
    "NATIVE_AGENTS",
    "NO_KEY_PLACEHOLDER",
    "NativeAgentWiringWarning",
    "NotTrainableWarning",
    "TrajectoryError",
    "native_agent_config",
    "sample_from_trajectory",
    "scoped_api_key",
]

logger = logging.getLogger(__name__)

NATIVE_AGENTS = ("oracle", "terminus-2", "mini-swe-agent")
DEFAULT_MODEL_NAME = "openai/osmosis-rollout"
API_FORMAT = ModelApiFormat.OPENAI_CHAT_COMPLETIONS
# mini-swe-agent reads the key from the OpenAI client's variable once the chat-completions
# format is selected (Harbor projects the selected key there too).
MINI_SWE_AGENT_KEY_VAR = "OPENAI_API_KEY"
# Sent as the bearer token when the rollout has no key. An empty key would make LiteLLM
# fall back to the host's own OPENAI_API_KEY and send *that* to the rollout endpoint.
NO_KEY_PLACEHOLDER = "osmosis-no-key"
TRAJECTORY_PATH = Path("agent") / "trajectory.json"

# Defaults suited to training; the user's native_agent_kwargs override them.
_DEFAULT_KWARGS: dict[str, dict[str, Any]] = {
    "terminus-2": {
        # Summarization rewrites the running context (and makes extra LLM calls), so the
        # trajectory would no longer be the one conversation the policy saw.
        "enable_summarize": False,
        # The trajectory keeps each model reply verbatim (not re-rendered as
        # "Analysis/Plan" + synthetic tool calls): the sample trains on what was generated.
        "trajectory_config": {"raw_content": True},
        # asciinema recordings are not needed for training and cost an install per sandbox.
        "record_terminal_session": False,
    },
    "mini-swe-agent": {},
}

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ORACLE_WARNED = False
_THIS_FILE = os.path.abspath(__file__)
_LOGGED: set[str] = set()


class NativeAgentWiringWarning(UserWarning):
    """A native_agent_kwargs entry tried to change the rollout endpoint wiring."""


class NotTrainableWarning(UserWarning):
    """The agent produces no model trajectory (oracle)."""


# ── the API key, scoped to one rollout ────────────────────────────────────────
@contextmanager
def scoped_api_key(api_key: str | None, *, prefix: str = "OSMOSIS_API_KEY") -> Iterator[str]:
    """Hold ``api_key`` in this process's environment under a fresh, unique name.

    Yields the variable's name, for ``native_agent_config(api_key_env=...)``; the
    variable is removed on exit, however the block ends. Keep the block open until the
    trial has finished (``await queue.submit(config)`` inside it): Harbor resolves the
    variable when it builds the agent and again whenever it re-resolves the connection.
    A rollout without a key gets ``NO_KEY_PLACEHOLDER``.
    """
    if not _ENV_NAME.fullmatch(prefix):
        raise ConfigError(f"prefix {prefix!r} is not a valid environment variable name")
    name = f"{prefix}_{uuid.uuid4().hex.upper()}"
    with settings.scoped_variable(name, api_key or NO_KEY_PLACEHOLDER):
        yield name


# ── AgentConfig ───────────────────────────────────────────────────────────────
def _caller_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel of the first frame outside this module."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename) == _THIS_FILE:
        frame, level = frame.f_back, level + 1
    return level


def _warn_override(agent: str, key: str, why: str) -> None:
    message = f"native_agent_kwargs[{key!r}] for {agent} ignored: {why}"
    if message not in _LOGGED:  # configs are built per rollout: log each problem once
        _LOGGED.add(message)
        logger.warning(message)
    warnings.warn(message, NativeAgentWiringWarning, stacklevel=_caller_stacklevel())


def _warn_not_trainable() -> None:
    global _ORACLE_WARNED
    if _ORACLE_WARNED:
        return
    _ORACLE_WARNED = True
    message = (
        "agent 'oracle' runs the task's reference solution (solution/solve.sh): it makes no "
        "model calls and produces no trajectory, so it is not trainable. Use it to validate "
        "tasks and verifiers, not to generate training data."
    )
    logger.warning(message)
    warnings.warn(message, NotTrainableWarning, stacklevel=_caller_stacklevel())


def _endpoint(url: str | None) -> str:
    if not url:
        raise ConfigError("a native agent needs the rollout's chat_completions_url")
    base = url.strip().rstrip("/")
    # Clients append /chat/completions themselves; accept the full URL too.
    if base.endswith("/chat/completions"):
        base = base.removesuffix("/chat/completions")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"chat_completions_url must be an http(s) URL, got {url!r}")
    return base


_COMMON_WIRED = {
    "model_name": "the model name is the rollout's model_name",
    "model": "the model name is the rollout's model_name",
    "base_url": "the endpoint is the rollout's chat_completions_url",
    "api_base": "the endpoint is the rollout's chat_completions_url",
    "api_key": "the key is the rollout's key, passed through the environment",
    "model_api_key_name": "the key is the rollout's key, passed through the environment",
    "model_api_format": "the rollout endpoint speaks OpenAI chat completions",
    "skip_model_parsing": "the rollout endpoint speaks OpenAI chat completions",
}
_CLIENT_WIRED = {
    "api_key": "the key is the rollout's key, passed through the environment",
    "api_base": "the endpoint is the rollout's chat_completions_url",
    "base_url": "the endpoint is the rollout's chat_completions_url",
    "custom_llm_provider": "the rollout endpoint speaks OpenAI chat completions",
}


def _drop(agent: str, mapping: dict[str, Any], wired: Mapping[str, str], prefix: str = "") -> None:
    for key, why in wired.items():
        if key in mapping:
            mapping.pop(key)
            _warn_override(agent, prefix + key, why)


def _terminus_kwargs(kwargs: dict[str, Any]) -> None:
    name = "terminus-2"
    backend = kwargs.get("llm_backend")
    if backend is not None and str(getattr(backend, "value", backend)) != "litellm":
        kwargs.pop("llm_backend")
        _warn_override(name, "llm_backend", "only the litellm backend calls the rollout endpoint")
    if kwargs.get("use_responses_api"):
        kwargs.pop("use_responses_api")
        _warn_override(name, "use_responses_api", "the rollout endpoint speaks OpenAI chat completions")
    for section in ("llm_kwargs", "llm_call_kwargs"):
        value = kwargs.get(section)
        if isinstance(value, Mapping):
            cleaned = dict(value)
            _drop(
                name, cleaned, {**_CLIENT_WIRED, "model": "the model name is the rollout's model_name"}, f"{section}."
            )
            kwargs[section] = cleaned


def _mini_kwargs(kwargs: dict[str, Any]) -> None:
    name = "mini-swe-agent"
    if kwargs.get("config_file") is not None:
        if kwargs.get("config") is not None:
            raise ConfigError("mini-swe-agent: 'config' and 'config_file' are mutually exclusive")
        # Inline it so the endpoint wiring can be checked against it.
        kwargs["config"] = yaml.safe_load(Path(kwargs.pop("config_file")).read_text()) or {}
    config = kwargs.get("config")
    if config is None:
        return
    if not isinstance(config, Mapping):
        raise ConfigError("mini-swe-agent: 'config' must be a mapping (mini-swe-agent's YAML config)")
    model = config.get("model")
    if not isinstance(model, Mapping):
        return
    model = dict(model)
    for key in ("model_name", "model_class"):
        if key in model:
            model.pop(key)
            _warn_override(
                name, f"config.model.{key}", "the rollout endpoint is called through LiteLLM chat completions"
            )
    model_kwargs = model.get("model_kwargs")
    if isinstance(model_kwargs, Mapping):
        model_kwargs = dict(model_kwargs)
        _drop(name, model_kwargs, _CLIENT_WIRED, "config.model.model_kwargs.")
        model["model_kwargs"] = model_kwargs
    kwargs["config"] = {**config, "model": model}


def native_agent_config(
    name: str,
    *,
    chat_completions_url: str | None = None,
    api_key_env: str = "OSMOSIS_API_KEY",
    model_name: str = DEFAULT_MODEL_NAME,
    native_agent_kwargs: dict[str, Any] | None = None,
    agent_timeout_sec: float | None = None,
    agent_setup_timeout_sec: float | None = None,
) -> AgentConfig:
    """The Harbor ``AgentConfig`` that runs native agent ``name`` against the rollout endpoint.

    ``api_key_env`` is the *name* of the host environment variable holding the key (see
    ``scoped_api_key``); the value is read by Harbor at trial time and never stored in the
    config. ``native_agent_kwargs`` are the agent's own options (Harbor's
    ``harbor agent schema <name>``); endpoint, model and key settings among them are
    ignored with a ``NativeAgentWiringWarning``. ``oracle`` takes no endpoint and warns
    once that it is not trainable.
    """
    settings.use_bundled_model_prices()  # before Harbor's agents import litellm
    if name not in NATIVE_AGENTS:
        raise ConfigError(f"unknown native agent {name!r}: choose one of {', '.join(NATIVE_AGENTS)}")
    user_kwargs = copy.deepcopy(dict(native_agent_kwargs or {}))

    if name == "oracle":
        _warn_not_trainable()
        return AgentConfig(
            name=name,
            kwargs=user_kwargs,
            override_timeout_sec=agent_timeout_sec,
            override_setup_timeout_sec=agent_setup_timeout_sec,
        )

    url = _endpoint(chat_completions_url)
    if not api_key_env or not _ENV_NAME.fullmatch(api_key_env):
        raise ConfigError(f"api_key_env must name an environment variable, got {api_key_env!r}")
    if not model_name:
        raise ConfigError("model_name must not be empty")

    kwargs = {**copy.deepcopy(_DEFAULT_KWARGS[name]), **user_kwargs}
    _drop(name, kwargs, _COMMON_WIRED)
    common: dict[str, Any] = {
        "name": name,
        "model_name": model_name,
        "base_url": url,
        "model_api_format": API_FORMAT,
        "override_timeout_sec": agent_timeout_sec,
        "override_setup_timeout_sec": agent_setup_timeout_sec,
    }
    if name == "terminus-2":
        _terminus_kwargs(kwargs)
        # LiteLLM runs on the host: Harbor reads the key from this process's environment.
        return AgentConfig(model_api_key_name=api_key_env, kwargs=kwargs, **common)
    _mini_kwargs(kwargs)
    # LiteLLM runs in the sandbox: the key travels as the exec env of the agent's commands.
    return AgentConfig(env={MINI_SWE_AGENT_KEY_VAR: f"${{{api_key_env}}}"}, kwargs=kwargs, **common)


# ── ATIF trajectory → RolloutSample ────────────────────────────────────────────
def sample_from_trajectory(trial_dir: Path, bounds: ContractBounds) -> RolloutSample | None:
    """The ``RolloutSample`` of a native agent's trial, from ``agent/trajectory.json``
    (see ``osmosis_harbor.shim.atif``); ``None`` when the agent left no trajectory."""
    try:  # the sandbox wrote it: read as a contract file (no links, no FIFOs, bounded)
        document = read_json(Path(trial_dir), str(TRAJECTORY_PATH), FileKind.TRAJECTORY, bounds)
    except ContractFileError as exc:
        raise TrajectoryError(f"{exc.relative}: not a readable JSON document: {exc.reason}") from None
    return None if document is None else sample_from_atif(document, TRAJECTORY_PATH)
