"""Our trial errors in Harbor 0.26's error policies, so Harbor treats them as their category says.

Harbor 0.26 maps a failure to ``ErrorPolicy(should_retry, should_grade, has_valid_reward)`` by
the exception's type name, and an unknown name retries, is graded and keeps its reward. Its
agent phase records any exception and goes on to the verifier unless the policy says not to, so
without this a lost sandbox would be graded. Every `TrialPhaseError` gets: never graded after
(on 0.25 each one ended its trial ungraded, and a lost sandbox is not graded), no valid reward,
and a retry only where one can help (``TrialPhaseError.should_retry``: a lost sandbox, a failed
build; not a workflow's own failure). Harbor's own names keep Harbor's policies (a verifier
timeout is not retried), and a user's ``override_error_policy`` applies on top of ours, as it
does on top of Harbor's: Harbor resolves both through ``policy_for``.

`install` adds ours to Harbor's table (a module global, read at each lookup); Harbor 0.25 has
no table and `install` does nothing there. A ``RetryConfig`` made after it excludes our
non-retryable errors by default, as Harbor's own non-retryable ones are.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from osmosis_harbor.errors import ConfigError, TrialPhaseError, trial_errors
from osmosis_harbor.harbor_compat.version import HARBOR

__all__ = ["POLICY_MODULE", "checked_overrides", "install", "installed", "policies", "retry_allowed"]

POLICY_MODULE = "harbor.models.trial.error_policy"
_lock = threading.Lock()


def policies() -> dict[str, tuple[bool, bool, bool]]:
    """Each of our trial errors' (should_retry, should_grade, has_valid_reward)."""
    return {name: _policy(cls) for name, cls in trial_errors().items()}


def _policy(cls: type[TrialPhaseError]) -> tuple[bool, bool, bool]:
    return (cls.should_retry(), False, False)


def install() -> bool:
    """Add our policies to Harbor's table (idempotent, thread-safe); False where Harbor has no
    error policies (0.25). Harbor's own entries are never replaced."""
    if not HARBOR.error_policies:
        return False
    module: Any = importlib.import_module(POLICY_MODULE)
    with _lock:
        table = module.ERROR_POLICIES
        ours = {
            name: module.ErrorPolicy(should_retry=r, should_grade=g, has_valid_reward=v)
            for name, (r, g, v) in policies().items()
            if name not in table
        }
        if ours:
            module.ERROR_POLICIES = MappingProxyType({**ours, **table})
    return True


def installed() -> bool:
    """Whether Harbor's table holds our policies now."""
    if not HARBOR.error_policies:
        return False
    table = importlib.import_module(POLICY_MODULE).ERROR_POLICIES
    return all(name in table for name in policies())


def checked_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """A user's ``override_error_policy`` (exception type name to the fields it changes), as
    Harbor 0.26's ``ErrorPolicyOverride`` models; `ConfigError` naming the entry that is wrong,
    and on Harbor 0.25, which has no error policies to override."""
    if not overrides:
        return {}
    if not HARBOR.error_policies:
        raise ConfigError(
            f"override_error_policy needs Harbor 0.26 or newer (installed: Harbor {HARBOR.name}), "
            "whose trials classify errors by policy; remove it or upgrade Harbor"
        )
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"override_error_policy must map exception type names to overrides, not {overrides!r}")
    model = importlib.import_module(POLICY_MODULE).ErrorPolicyOverride
    checked: dict[str, Any] = {}
    for name, override in overrides.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"override_error_policy: {name!r} is not an exception type name")
        try:
            checked[name] = override if isinstance(override, model) else model.model_validate(override)
        except ValidationError as exc:
            fields = "should_retry, should_grade, has_valid_reward"
            raise ConfigError(f"override_error_policy[{name!r}]: {exc.errors()[0]['msg']} (fields: {fields})") from None
    return checked


def retry_allowed(exception_type: str, overrides: Mapping[str, Any]) -> bool:
    """Whether a failure of ``exception_type`` may be retried under the user's overrides (a
    ``should_retry`` the user set wins; without one, ours and Harbor's policies decide)."""
    override = overrides.get(exception_type)
    return override is None or override.should_retry is not False
