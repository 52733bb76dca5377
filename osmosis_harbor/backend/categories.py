"""Which failure category a rollout gets, from what the host saw rather than what a sandbox said.

A trainer masks ``internal_error`` rollouts out of the reward (the infrastructure failed, not
the policy), so a category a sandbox can choose is a reward a policy can choose. A workflow's
(or a grader's) own ``error.json`` may therefore say *what* failed in its own words, but the
category it can cause is at most ``agent_error`` or ``validation_error``, or ``timeout``
where the shim's deadline really fired: the host set that deadline, and the phase ran at
least that long by the host's own clock. ``internal_error`` comes only from the host's
observations: a lost sandbox, an engine or SDK error, our own exceptions, in either phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from osmosis_ai.rollout.types import RolloutErrorCategory

from osmosis_harbor.errors import recorded_error
from osmosis_harbor.shim.models import ErrorClaim
from osmosis_harbor.trials.reading import TIMEOUT_EXCEPTIONS, TrialReading

__all__ = ["Claim", "claimed_category", "verifier_failure"]

# What a sandbox may claim about its own failure.
SANDBOX_CATEGORIES = frozenset({RolloutErrorCategory.AGENT_ERROR, RolloutErrorCategory.VALIDATION_ERROR})
# Harbor's verdicts on the tests' or grader's own output: the verifier ran and said nothing usable.
GRADER_OUTPUT_EXCEPTIONS = frozenset({"RewardFileNotFoundError", "RewardFileEmptyError", "VerifierOutputParseError"})
_MESSAGE_LIMIT = 2000  # a claim's words travel to the controller: keep them a message, not a payload


@dataclass(frozen=True)
class Claim:
    """What a sandbox's ``error.json`` says, as plain bounded strings (nothing else of it is used)."""

    type: str
    message: str
    category: Any

    @classmethod
    def of(cls, document: Any) -> Claim:
        """The claim of an ``error.json`` document, read through its model (``ErrorClaim``)."""
        if not isinstance(document, dict):
            return cls("Error", _bounded(str(document)), None)
        said = ErrorClaim.model_validate(document)
        return cls(_bounded(said.type, 200), _bounded(said.message), said.category)


def _bounded(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def claimed_category(claim: Any, *, deadline_sec: float | None, ran_sec: float | None) -> RolloutErrorCategory:
    """The category a sandbox's own claim may cause: its ``agent_error`` or ``validation_error``;
    ``timeout`` only when the host set a deadline of ``deadline_sec`` and saw the phase run
    ``ran_sec`` >= that; anything else (``internal_error`` above all) is ``agent_error``."""
    try:
        category = RolloutErrorCategory(claim)
    except ValueError:
        return RolloutErrorCategory.AGENT_ERROR
    if category is RolloutErrorCategory.TIMEOUT:
        fired = deadline_sec is not None and ran_sec is not None and ran_sec >= deadline_sec
        return category if fired else RolloutErrorCategory.AGENT_ERROR
    return category if category in SANDBOX_CATEGORIES else RolloutErrorCategory.AGENT_ERROR


def verifier_failure(
    exception_type: str | None, reading: TrialReading, claim: Claim | None
) -> tuple[RolloutErrorCategory, str]:
    """Category and message of a failed verification. Harbor's timeout is a ``timeout``; an
    exception the host met while verifying (the engine stopped, the SDK failed, a transfer
    broke, one of ours) is an ``internal_error``, whatever the grader wrote; the grader's
    own failure (its ``error.json``, or no usable reward) is at most ``agent_error``.
    The host sets the grader no deadline of its own, so a grader's claimed ``timeout`` is
    not believed: Harbor's verifier timeout is the one the host saw."""
    if exception_type in TIMEOUT_EXCEPTIONS:
        return RolloutErrorCategory.TIMEOUT, f"verifier timed out: {reading.error}"
    if exception_type is not None and exception_type not in GRADER_OUTPUT_EXCEPTIONS:
        ours = recorded_error(exception_type)
        category = ours.category if ours is not None else RolloutErrorCategory.INTERNAL_ERROR
        side = "" if category is RolloutErrorCategory.AGENT_ERROR else " on the host's side"
        return category, f"verification failed{side}: {reading.error}"
    if claim is not None:
        category = claimed_category(claim.category, deadline_sec=None, ran_sec=None)
        return category, f"grader failed: {claim.type}: {claim.message}"
    return RolloutErrorCategory.AGENT_ERROR, f"verifier failed: {reading.error}"
