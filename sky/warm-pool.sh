#!/usr/bin/env bash
# Warm-pool definition for the bundled template task's image: builds and pushes the image
# (reused when the registry has it), proves the bundle installs, and keeps POOL_SIZE sandboxes
# of it running under the pool name "$POOL_NAME-<environment hash>".
#   sky/warm-pool.sh [extra prewarm args...]   (e.g. --workflow mod:Cls --code-dir DIR)
# Environment: POOL_NAME (default osmosis-template), POOL_SIZE (default 4),
# SKYPILOT_API_SERVER_ENDPOINT / HARBOR_SKYPILOT_REGISTRY as for ci-validate.sh.
# Remove local pools with: python -m osmosis_harbor cleanup --pool "$POOL_NAME"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$PY" -m osmosis_harbor prewarm "$ROOT/tasks/template" "${ENV_ARGS[@]}" \
  --pool "${POOL_NAME:-osmosis-template}" --pool-size "${POOL_SIZE:-4}" "$@"
