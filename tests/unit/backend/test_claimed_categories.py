"""A rollout's failure category comes from what the host saw (``backend/categories.py``): what a
sandbox claims can cause at most ``agent_error`` or ``validation_error``, ``timeout`` only when
the host's own deadline fired; ``internal_error`` only from the host's observations. And which
of our trial errors a retry can help (``errors.py``)."""

from __future__ import annotations

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory as Category

from osmosis_harbor.backend.categories import Claim, claimed_category, verifier_failure
from osmosis_harbor.errors import (
    AgentSandboxLostError,
    BaseImageMissingError,
    ImageBuildError,
    SandboxLostError,
    VerifierSandboxLostError,
    WorkflowFailedError,
    WrongBundleError,
    recorded_error,
    trial_errors,
)
from osmosis_harbor.trials.reading import TrialReading


@pytest.mark.parametrize(
    ("claimed", "expected"),
    [
        ("agent_error", Category.AGENT_ERROR),
        ("validation_error", Category.VALIDATION_ERROR),
        ("internal_error", Category.AGENT_ERROR),  # masked out of the reward: never the sandbox's to choose
        ("no-such-category", Category.AGENT_ERROR),
        (None, Category.AGENT_ERROR),
        (["internal_error"], Category.AGENT_ERROR),
    ],
)
def test_a_sandbox_claim_causes_at_most_its_own_categories(claimed: object, expected: Category) -> None:
    assert claimed_category(claimed, deadline_sec=None, ran_sec=None) is expected


@pytest.mark.parametrize(
    ("deadline", "ran", "expected"),
    [(60.0, 60.0, Category.TIMEOUT), (60.0, 59.9, Category.AGENT_ERROR), (None, 600.0, Category.AGENT_ERROR)],
)
def test_a_claimed_timeout_counts_only_when_the_hosts_deadline_fired(
    deadline: float | None, ran: float, expected: Category
) -> None:
    assert claimed_category("timeout", deadline_sec=deadline, ran_sec=ran) is expected


def test_a_claim_keeps_bounded_strings_only() -> None:
    claim = Claim.of({"type": "T" * 500, "message": "m" * 5000, "category": "internal_error", "extra": object()})
    assert len(claim.type) == 200 and len(claim.message) == 2000 and claim.message.endswith("…")
    assert Claim.of(["not", "a", "dict"]) == Claim("Error", "['not', 'a', 'dict']", None)


READING = TrialReading(reward=None, error="it broke")


@pytest.mark.parametrize(
    ("exception", "claim", "expected"),
    [
        ("VerifierTimeoutError", None, Category.TIMEOUT),
        ("AgentSandboxLostError", Claim("Forged", "blame me", "agent_error"), Category.INTERNAL_ERROR),
        ("DockerException", Claim("Forged", "", "validation_error"), Category.INTERNAL_ERROR),
        ("RewardFileNotFoundError", None, Category.AGENT_ERROR),
        ("RewardFileNotFoundError", Claim("GraderError", "bad input", "validation_error"), Category.VALIDATION_ERROR),
        (None, Claim("GraderError", "slow", "timeout"), Category.AGENT_ERROR),  # the grader has no deadline of ours
        (None, Claim("GraderError", "forged", "internal_error"), Category.AGENT_ERROR),
        ("WorkflowFailedError", None, Category.AGENT_ERROR),  # ours, with its own category
    ],
)
def test_a_failed_verification_is_categorised_by_what_the_host_saw(
    exception: str | None, claim: Claim | None, expected: Category
) -> None:
    category, message = verifier_failure(exception, READING, claim)
    assert category is expected
    assert (claim.message in message) if claim is not None and exception in (None, "RewardFileNotFoundError") else True


def test_every_trial_error_is_found_by_the_name_harbor_records() -> None:
    errors = trial_errors()
    for cls in (AgentSandboxLostError, VerifierSandboxLostError, WorkflowFailedError, BaseImageMissingError):
        assert errors[cls.__name__] is cls and recorded_error(cls.__name__) is cls
    assert recorded_error("ValueError") is None and recorded_error(None) is None


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        (AgentSandboxLostError, True),  # the infrastructure's: a fresh sandbox may succeed
        (ImageBuildError, True),
        (BaseImageMissingError, False),  # a missing base image stays missing
        (WorkflowFailedError, False),  # the workflow's own failure
        (WrongBundleError, False),
    ],
)
def test_a_retry_is_asked_for_only_where_it_can_help(error: type, retry: bool) -> None:
    assert error.should_retry() is retry


def test_a_loss_names_whose_sandbox_it_was() -> None:
    lost = SandboxLostError.of_role("verifier", "hb-x", "gone")
    assert isinstance(lost, VerifierSandboxLostError) and lost.sandbox_name == "hb-x" and "gone" in str(lost)
    assert lost.category is Category.INTERNAL_ERROR
