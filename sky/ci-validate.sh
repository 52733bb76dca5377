#!/usr/bin/env bash
# CI recipe: oracle-validate a Harbor dataset in sandboxes (SkyPilot when configured).
#   sky/ci-validate.sh [DATASET] [extra validate args...]
# Environment: SKYPILOT_API_SERVER_ENDPOINT (selects SkyPilot), HARBOR_SKYPILOT_REGISTRY
# (required with SkyPilot), OSMOSIS_HARBOR_CI_CONCURRENCY (default 8 on SkyPilot, 2 locally).
# Writes sandbox-ci-report.json; exits non-zero if any task fails.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
DATASET="${1:-$ROOT/tasks}"; shift || true
default_n=2; [ "$OSMOSIS_HARBOR_ENV" = skypilot ] && default_n=8
exec "$PY" -m osmosis_harbor validate "$DATASET" "${ENV_ARGS[@]}" \
  -n "${OSMOSIS_HARBOR_CI_CONCURRENCY:-$default_n}" --json "${OSMOSIS_HARBOR_CI_REPORT:-sandbox-ci-report.json}" "$@"
