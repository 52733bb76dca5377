"""Developer sessions. The test suite itself runs with ``.venv/bin/python -m pytest``
(see README); nox adds the lint, benchmark and sandbox-CI sessions on top of the same venv."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "none"  # reuse .venv: bootstrap.sh owns installs
PY = ".venv/bin/python"


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite."""
    session.run("bash", "scripts/bootstrap.sh", external=True)
    session.run(PY, "-m", "pytest", "-q", *session.posargs, external=True)


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
