#!/usr/bin/env bash
# The lint CI runs before the tests (.ci/run), and `nox -s lint`: ruff (lint and format),
# import-linter (the layer contracts in pyproject.toml), mypy on the package, and the checks in
# scripts/ (the environment read in settings/ only; import circles).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${LINT_BIN:-.venv/bin}"
"$BIN/ruff" check .
"$BIN/ruff" format --check .
"$BIN/lint-imports"
"$BIN/mypy"
"$BIN/python" scripts/check_environ.py
"$BIN/python" scripts/check_harbor_private.py
# Import circles, TYPE_CHECKING imports included (import-linter does not look for circles).
"$BIN/python" scripts/check_cycles.py
