# Shared by the recipes here: pick the sandbox backend and the Python to run.
# SkyPilot when an API endpoint is configured (`sky api login` or SKYPILOT_API_SERVER_ENDPOINT),
# the local Docker sandbox otherwise. Override with OSMOSIS_HARBOR_ENV=docker|skypilot.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${OSMOSIS_HARBOR_PYTHON:-$ROOT/.venv/bin/python}"
if [ -z "${OSMOSIS_HARBOR_ENV:-}" ]; then
  if [ -n "${SKYPILOT_API_SERVER_ENDPOINT:-}" ]; then OSMOSIS_HARBOR_ENV=skypilot; else OSMOSIS_HARBOR_ENV=docker; fi
fi
ENV_ARGS=(--env "$OSMOSIS_HARBOR_ENV")
if [ "$OSMOSIS_HARBOR_ENV" = skypilot ]; then
  if [ -z "${HARBOR_SKYPILOT_REGISTRY:-}" ]; then
    echo "error: set HARBOR_SKYPILOT_REGISTRY to a registry the cluster can pull from" >&2
    exit 2
  fi
  ENV_ARGS+=(--registry "$HARBOR_SKYPILOT_REGISTRY")
fi
