"""Our trial errors in Harbor's error policies, so Harbor treats them as their category says.

Harbor maps a failure to an ``ErrorPolicy`` by the exception's type name. On 0.26 the policy is
``(should_retry, should_grade, has_valid_reward)`` and an unknown name retries, is graded and
keeps its reward; its agent phase records any exception and goes on to the verifier unless the
policy says not to, so without ours a lost sandbox would be graded. Every `TrialPhaseError`
gets: never graded after (on 0.25 each one ended its trial ungraded, and a lost sandbox is not
graded), no valid reward, and a retry only where one can help (``TrialPhaseError.should_retry``:
a lost sandbox, a failed build; not a workflow's own failure). On 0.25 the policy is
``(cause, retry, grade)`` and drives only the reports (``TrialResult.failure_cause``): ours get
the cause `failure_cause_025` names instead of ``unclassified``. Harbor's own names keep
Harbor's policies, and a user's ``override_error_policy`` applies on top of ours, as it does on
top of Harbor's (Harbor resolves both through ``policy_for``).

`install` adds ours to Harbor's table (a module global, read at each lookup). A ``RetryConfig``
computes its default exclusions when it is made, so one made before `install` would still retry
our non-retryable errors: `exclude_ours` completes a queue's default exclusions whatever the
order (``HarborBackend`` does it to the queue it is given; exclusions a user wrote out stay).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from osmosis_ai.rollout.types import RolloutErrorCategory
from pydantic import ValidationError

from osmosis_harbor.errors import (
    ConfigError,
    SandboxError,
    TrialPhaseError,
    WorkflowFailedError,
    trial_errors,
)
from osmosis_harbor.harbor_compat.version import HARBOR

__all__ = [
    "POLICY_MODULE",
    "checked_overrides",
    "exclude_ours",
    "failure_cause_025",
    "install",
    "installed",
    "policies",
    "retry_allowed",
]

POLICY_MODULE = "harbor.models.trial.error_policy"
_lock = threading.Lock()


def policies() -> dict[str, tuple[bool, bool, bool]]:
    """Each of our trial errors' (should_retry, should_grade, has_valid_reward)."""
    return {name: _policy(cls) for name, cls in trial_errors().items()}


def _policy(cls: type[TrialPhaseError]) -> tuple[bool, bool, bool]:
    return (cls.should_retry(), False, False)


def failure_cause_025(cls: type[TrialPhaseError]) -> str:
    """The 0.25 ``FailureCause`` value of one of our errors: who ended the trial.

    The infrastructure's failures and a task image that cannot run the bundle are the sandbox's;
    the verifier refusing a tampered sandbox is the verifier's; a sandbox bound the agent's own
    output passed (disk, transfer size, an unreadable archive) is the agent's budget. A workflow
    that exits non-zero keeps the cause Harbor gives its own agent's non-zero exit
    (``NonZeroAgentExitCodeError``: ``unclassified``), so the two read alike in Harbor's reports."""
    if cls.category is RolloutErrorCategory.AGENT_ERROR:
        if issubclass(cls, WorkflowFailedError):
            return "unclassified"
        if cls.phase == "verifier":
            return "verifier_failed"
        if issubclass(cls, SandboxError):
            return "agent_exhausted_budget"
        return "unclassified"
    return "sandbox_failed"


def _ours_for(module: Any) -> dict[str, Any]:
    """Our entries in the installed line's ``ErrorPolicy`` shape."""
    if HARBOR.error_policies:
        return {
            name: module.ErrorPolicy(should_retry=r, should_grade=g, has_valid_reward=v)
            for name, (r, g, v) in policies().items()
        }
    return {
        name: module.ErrorPolicy(module.FailureCause(failure_cause_025(cls)), retry=cls.should_retry(), grade=False)
        for name, cls in trial_errors().items()
    }


def install() -> bool:
    """Add our policies to Harbor's table (idempotent, thread-safe); Harbor's own entries are
    never replaced. True once the table holds ours."""
    module: Any = importlib.import_module(POLICY_MODULE)
    with _lock:
        table = module.ERROR_POLICIES
        ours = {name: policy for name, policy in _ours_for(module).items() if name not in table}
        if ours:
            module.ERROR_POLICIES = MappingProxyType({**ours, **table})
    return True


def installed() -> bool:
    """Whether Harbor's table holds our policies now."""
    table = importlib.import_module(POLICY_MODULE).ERROR_POLICIES
    return all(name in table for name in policies())


def exclude_ours(retry: Any, overrides: Mapping[str, Any] | None = None) -> set[str]:
    """Complete ``retry`` (a queue's ``RetryConfig``, changed in place) with our errors that must
    not be retried, as if it had been made after `install`, and return what it now excludes of
    ours. A ``RetryConfig`` takes its default exclusions from Harbor's table when it is made, so
    one made before `install` would have Harbor's queue run a workflow's own failure again. A
    user's ``override_error_policy`` then applies on top, as Harbor's ``JobConfig`` applies it.
    Exclusions the user wrote out (``exclude_exceptions=``) are theirs and stay as written, as
    Harbor leaves them (its own non-retryable errors are not added to them either)."""
    if "exclude_exceptions" in retry.model_fields_set:
        return set(retry.exclude_exceptions or ()) & set(trial_errors())
    overrides = overrides or {}
    excluded = set(retry.exclude_exceptions or ())
    excluded |= {name for name, cls in trial_errors().items() if not cls.should_retry()}
    for name, override in overrides.items():
        if override.should_retry is True:
            excluded.discard(name)
        elif override.should_retry is False:
            excluded.add(name)
    retry.exclude_exceptions = excluded
    retry.model_fields_set.discard("exclude_exceptions")  # still Harbor's default, completed
    return excluded & set(trial_errors())


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
