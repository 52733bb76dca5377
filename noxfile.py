"""Developer sessions. The test suite itself runs with ``.venv/bin/python -m pytest``
(see README); nox adds the lint, benchmark and sandbox-CI sessions on top of the same venv,
and a session per supported Harbor line: 0.25 in ``.venv`` (the default install), 0.26 in
``.venv26`` (``scripts/bootstrap.sh --harbor 0.26``)."""

from __future__ import annotations

import subprocess

import nox

nox.options.default_venv_backend = "none"  # reuse .venv: bootstrap.sh owns installs
PY = ".venv/bin/python"
PY026 = ".venv26/bin/python"
HARBOR_UNAVAILABLE = 3  # bootstrap.sh --harbor: no such Harbor on the configured index

# What the Harbor 0.26 leg runs by default: every difference between the lines, and the key
# end-to-end paths, each on both local SDKs where the test is parametrized by SDK.
HARBOR_026_TESTS = (
    "tests/unit/harbor_compat/test_surface.py",
    "tests/unit/sandbox/test_skypilot_call_shapes.py",  # the sky.sandbox calls kept from Harbor
    "tests/e2e/cli/test_harbor_lines.py",  # preflight, options, error policies, harbor run, a lost sandbox
    "tests/e2e/backend/test_rollouts.py::test_template_mode_with_grader",  # graded and ungraded rollouts
    "tests/e2e/backend/test_rollouts.py::test_status_transitions_and_a_grader_timeout_through_the_server",  # a verifier timeout
    "tests/e2e/cli/test_public_formats.py::test_oracle_verdicts_on_public_task_formats",  # validate, multi-step
    "tests/e2e/cli/test_public_formats.py::test_nop_verdicts_on_public_task_formats",
    "tests/e2e/guard/test_reward_integrity.py",
    "tests/e2e/lost_sandbox/test_lost_in_agent_or_verifier.py",  # a lost sandbox, infra_retries
    "tests/e2e/transfer/test_exec_folds.py",  # transfers riding Harbor's verifier command
    "tests/e2e/backend/test_workers.py",  # workers=N: each worker's queue rebuilt from the user's (harbor_compat/queue_facts.py)
    "tests/e2e/backend/test_terminations_after_result.py",  # a result before its sandboxes' terminations, through Harbor's trial
    "tests/e2e/backend/test_baked_bundle.py::test_sandbox_call_budget_of_trivial_and_graded_rollouts",  # the default transfer route
    # a task's own tests in a fresh sandbox of its image (Harbor's separate verifier), plants that do not pay
    "tests/e2e/guard/test_fresh_verifier.py::test_an_honest_answer_scores_one_and_a_wrong_one_zero",
    "tests/e2e/guard/test_fresh_verifier.py::test_no_plant_in_the_agents_sandbox_pays_in_a_fresh_one",
    "tests/e2e/guard/test_fresh_verifier.py::test_no_plant_in_the_images_trees_pays_in_a_fresh_one",  # docker
    "tests/e2e/guard/test_verifier_guard.py::test_the_guard_ends_every_attack_as_the_workflows_failure",  # the shared guard
    "tests/e2e/guard/test_verifier_guard.py::test_the_guard_ends_each_further_attack_as_the_workflows_failure",  # docker
    "tests/e2e/backend/test_unencodable_results.py::test_a_workflows_unencodable_failure_is_its_own_in_process",  # Harbor's records
    "tests/e2e/cli/test_leak_audit.py::test_a_training_server_refuses_a_leaking_task_by_default",  # the leak audit
)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite (on Harbor 0.25, the default install)."""
    session.run("bash", "scripts/bootstrap.sh", external=True)
    session.run(PY, "-m", "pytest", "-q", *session.posargs, external=True)


@nox.session(name="tests-harbor-0.25", default=False)
def tests_harbor_025(session: nox.Session) -> None:
    """The whole test suite on Harbor 0.25: ``tests``, by its line's name."""
    tests(session)


@nox.session(name="tests-harbor-0.26")
def tests_harbor_026(session: nox.Session) -> None:
    """mypy against Harbor 0.26, then the key tests there (``HARBOR_026_TESTS``; pass test paths
    to run others, the whole suite with ``-- tests``). Skipped, saying why, when the package
    index has no 0.26."""
    session.log("bootstrap.sh --harbor 0.26")
    status = subprocess.run(["bash", "scripts/bootstrap.sh", "--harbor", "0.26"], check=False).returncode
    if status == HARBOR_UNAVAILABLE:
        session.skip("Harbor 0.26 is not installable from the configured package index (bootstrap said why)")
    if status != 0:
        session.error(f"bootstrap.sh --harbor 0.26 failed (exit status {status})")
    session.run(PY026, "-m", "mypy", "osmosis_harbor", external=True)  # our code typed against 0.26's Harbor
    session.run(PY026, "-m", "pytest", "-q", *(session.posargs or HARBOR_026_TESTS), external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format), import-linter (the layer contracts in pyproject.toml), mypy."""
    session.run("bash", "scripts/bootstrap.sh", external=True)
    session.run("bash", "scripts/lint.sh", external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: medians with a same-run baseline; figures printed and written to JSON."""
    session.run("bash", "scripts/bootstrap.sh", external=True)
    session.run(PY, "-m", "bench", *session.posargs, external=True)


@nox.session(name="sandbox-ci")
def sandbox_ci(session: nox.Session) -> None:
    """Validate the bundled dataset in SkyPilot sandboxes when an API endpoint is
    configured, in local Docker sandboxes otherwise (the recipe in sky/ci-validate.sh)."""
    session.run("bash", "scripts/bootstrap.sh", external=True)
    session.run("bash", "sky/ci-validate.sh", "tasks", *session.posargs, external=True)
