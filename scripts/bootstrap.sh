#!/usr/bin/env bash
# Bring a machine to the state the README commands, the tests and CI need, idempotently:
#   1. a virtualenv (.venv) on Python >= 3.12 with osmosis-harbor and its dev extras, and the
#      verifier guard built (a C compiler; as root on Debian it installs gcc);
#   2. a running Docker engine (on Debian as root: apt-get install docker.io, start dockerd);
#   3. the offline base images the bundled tasks and the tests use (scripts/base-images.sh:
#      debian:trixie-slim, python:3.12-slim, ubuntu:24.04, python:3.13-slim; one debootstrap);
#   4. a local image registry on 127.0.0.1:5000 for the build-and-push path;
#   5. with --harbor 0.26: a second virtualenv (.venv26) with Harbor 0.26 in place of the default
#      0.25, for the suite's Harbor 0.26 leg (noxfile.py). Exit status 3 when no Harbor 0.26 wheel
#      is installable from the configured package index (that leg is then skipped, and says so).
# A second run does only cheap checks (a few seconds).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="${OSMOSIS_HARBOR_CACHE:-$HOME/.cache/osmosis-harbor}"
REGISTRY_ADDR="${OSMOSIS_HARBOR_REGISTRY_ADDR:-127.0.0.1:5000}"
mkdir -p "$STATE"

log() { printf '[bootstrap] %s\n' "$*" >&2; }
die() {
  printf '[bootstrap] error: %s\n' "$*" >&2
  if [ -n "${venv_pid:-}" ]; then kill "$venv_pid" 2>/dev/null || true; fi  # no half-made .venv left installing
  exit 1
}
is_root() { [ "$(id -u)" = 0 ]; }
have() { command -v "$1" >/dev/null 2>&1; }

APT_UPDATED=0
apt_install() {
  is_root && have apt-get || die "cannot install $* automatically (need root on Debian): install it yourself"
  if [ "$APT_UPDATED" = 0 ]; then apt-get update -qq -o DPkg::Lock::Timeout=300 >/dev/null; APT_UPDATED=1; fi
  # the engine side and the virtualenv run side by side (below): one waits for the other's lock
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "$@" >/dev/null
}

# ── 1. Python >= 3.12 and the virtualenv ─────────────────────────────────────
# A Python whose tarfile has the 2025 fixes (CVE-2024-12718, CVE-2025-4330, CVE-2025-4517:
# 3.12.11+ or 3.13.4+) is preferred. Our extractor does not rely on them (it never calls
# tarfile's extraction on what a sandbox made), so an unpatched one is used with a warning.
TARFILE_FIXED='import sys; v = sys.version_info[:3]; sys.exit(not (v >= (3, 13, 4) or (3, 12, 11) <= v < (3, 13)))'

python_candidates() {
  local c
  for c in python3.13 python3.12 python3; do
    if have "$c"; then command -v "$c"; fi
  done
  # pyenv installs versions that its shims only expose when selected: look directly.
  for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
    if [ -x "$c" ]; then echo "$c"; fi
  done
}

find_python() {
  local c fallback=""
  while read -r c; do
    "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || continue
    if "$c" -c "$TARFILE_FIXED" 2>/dev/null; then
      echo "$c"; return 0
    fi
    [ -n "$fallback" ] || fallback="$c"
  done < <(python_candidates)
  [ -n "$fallback" ] || return 1
  log "warning: $("$fallback" -V 2>&1) ($fallback) lacks the 2025 tarfile fixes (CVE-2024-12718, CVE-2025-4330, CVE-2025-4517); install Python 3.12.11+ or 3.13.4+ and re-create .venv. osmosis-harbor's own extraction does not depend on them."
  echo "$fallback"
}

# The Harbor line .venv holds: the suite, the lint and mypy run on it; the other line's leg runs in
# .venv26 (--harbor 0.26). Pinned, since a fresh resolve of `harbor>=0.25,<0.27` takes the newest.
DEFAULT_HARBOR="harbor>=0.25,<0.26"

ensure_venv() {
  local stamp=".venv/.osmosis-harbor-installed" want
  want="$( (cat pyproject.toml; echo "$DEFAULT_HARBOR") | sha256sum | cut -c1-16)"
  if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  if [ ! -x .venv/bin/python ]; then
    local py
    py="$(find_python)" || {
      if is_root && have apt-get; then
        apt_install python3 python3-venv
        py="$(find_python)" || die "no Python >= 3.12 found; install python3.12 (or newer) and re-run"
      else
        die "no Python >= 3.12 found; install python3.12 (or newer) and re-run"
      fi
    }
    log "creating .venv with $py"
    "$py" -m venv .venv
  fi
  log "installing osmosis-harbor[dev,docker] into .venv"
  # uv resolves and installs the same set as pip (checked: identical freeze) in a fifth of the
  # time (26 s against 138 s here, warm caches): most of a fresh bootstrap was this install.
  # pip stays the fallback where uv cannot be had. uv leaves the bytecode to the first import,
  # as pip does not: compiled here, beside the engine side, instead of by the first processes of
  # the test run (each importing Harbor, litellm and osmosis_ai for the first time).
  if .venv/bin/python -m pip install -q uv >"$STATE/pip-install.log" 2>&1 \
     && .venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python -e '.[dev,docker]' "$DEFAULT_HARBOR" >>"$STATE/pip-install.log" 2>&1; then
    :
  else
    log "uv could not install it (log: $STATE/pip-install.log); trying pip"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    if ! .venv/bin/python -m pip install -q -e '.[dev,docker]' "$DEFAULT_HARBOR" >"$STATE/pip-install.log" 2>&1; then
      tail -40 "$STATE/pip-install.log" >&2
      die "pip install failed (full log: $STATE/pip-install.log)"
    fi
  fi
  echo "$want" >"$stamp"
}

# ── 1c. A second Harbor line (--harbor 0.26): .venv26 ───────────────────────────────────────
HARBOR_UNAVAILABLE=3

ensure_harbor_venv() {
  local line="$1" dir=".venv${1#0.}" stamp want spec  # 0.26: .venv26
  spec="harbor>=${line},<0.$(( ${line#0.} + 1 ))"
  stamp="$dir/.osmosis-harbor-installed"
  want="$( (cat pyproject.toml; cat .venv/.osmosis-harbor-installed; echo "$spec") | sha256sum | cut -c1-16)"
  if [ -x "$dir/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  # Installed from the configured package index only: find out first whether it has this Harbor.
  if ! .venv/bin/python -m pip download -q --no-deps "$spec" -d "$STATE/harbor-$line" >"$STATE/harbor-$line.log" 2>&1; then
    log "no Harbor $line is installable from the configured package index ($spec; see 'pip config list'; log: $STATE/harbor-$line.log): the Harbor $line leg is skipped"
    exit "$HARBOR_UNAVAILABLE"
  fi
  # .venv with Harbor upgraded: the two legs differ in Harbor and what it needs, nothing else,
  # in seconds rather than a fresh install's minutes. Its scripts are pointed at the copy.
  log "making $dir: a copy of .venv with $spec"
  rm -rf "$dir" "$dir.tmp"
  cp -a .venv "$dir.tmp"
  grep -rlI "$ROOT/.venv" "$dir.tmp/bin" | xargs -r sed -i "s#$ROOT/\.venv\b#$ROOT/$dir#g"
  mv "$dir.tmp" "$dir"
  if ! { "$dir/bin/python" -m pip install -q "$spec" \
         && "$dir/bin/python" -m pip install -q --no-deps --no-build-isolation -e .; } >"$STATE/pip-install-$line.log" 2>&1; then
    tail -40 "$STATE/pip-install-$line.log" >&2
    die "pip install into $dir failed (full log: $STATE/pip-install-$line.log)"
  fi
  "$dir/bin/python" -c "import importlib.metadata as m, sys; v = m.version('harbor'); sys.exit(not v.startswith('$line.'))" \
    || die "$dir has no Harbor $line after the install (log: $STATE/pip-install-$line.log)"
  echo "$want" >"$stamp"
}

# ── 1b. The verifier guard (osmosis_harbor/sandbox/guard): a static program built with cc ──
ensure_guard() {
  if ! have cc; then
    log "installing gcc (the verifier guard is built from its C source)"
    apt_install gcc
  fi
  .venv/bin/python -c 'from osmosis_harbor import settings; from osmosis_harbor.sandbox.guard import guard_binary; guard_binary(config=settings.current())' \
    || die "building the verifier guard failed (see above); OSMOSIS_HARBOR_VERIFIER_GUARD=0 runs without it"
}

# ── 2. Docker engine ─────────────────────────────────────────────────────────
engine_up() { timeout 10 docker info >/dev/null 2>&1; }

ensure_docker() {
  if have docker && engine_up; then return 0; fi
  if ! have dockerd; then
    is_root && have apt-get || die "no Docker engine is running and dockerd is not installed: install Docker Engine and start it"
    log "installing docker.io"
    apt_install docker.io
  fi
  if ! have docker; then die "docker client missing after install"; fi
  is_root || die "the Docker engine is not running: start it (e.g. 'sudo systemctl start docker')"
  log "starting dockerd"
  nohup dockerd >/var/log/osmosis-harbor-dockerd.log 2>&1 &
  for _ in $(seq 1 120); do
    engine_up && { log "dockerd is up"; return 0; }
    sleep 0.5
  done
  tail -20 /var/log/osmosis-harbor-dockerd.log >&2 || true
  die "dockerd did not come up (log: /var/log/osmosis-harbor-dockerd.log)"
}

# ── 4. Local registry ────────────────────────────────────────────────────────
registry_up() { .venv/bin/python - "$REGISTRY_ADDR" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://{sys.argv[1]}/v2/", timeout=2).read()
PY
}

ensure_registry() {
  if registry_up; then return 0; fi
  if ! have docker-registry; then
    is_root && have apt-get || { log "no local registry (install Debian's docker-registry to test the push path)"; return 0; }
    log "installing docker-registry"
    apt_install docker-registry
  fi
  local dir="$STATE/registry"
  mkdir -p "$dir/data"
  cat >"$dir/config.yml" <<YML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
YML
  log "starting docker-registry on $REGISTRY_ADDR"
  nohup docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
  for _ in $(seq 1 60); do
    registry_up && return 0
    sleep 0.25
  done
  die "docker-registry did not come up (log: $dir/registry.log)"
}

# Usage: scripts/bootstrap.sh [--harbor 0.26] [--then COMMAND ARGS...]
THEN=()
HARBOR_LINE=""
if [ "${1:-}" = "--harbor" ]; then
  HARBOR_LINE="${2:-}"
  [ "$HARBOR_LINE" = 0.26 ] || die "--harbor takes 0.26 (the default venv has Harbor 0.25)"
  shift 2
fi
if [ "${1:-}" = "--then" ]; then shift; THEN=("$@"); fi

# The virtualenv (a package index, pip and uv) and the engine side (apt, dockerd, debootstrap and
# image builds) share nothing until the guard and the registry: on a fresh machine they run side
# by side, and the slower of the two sets the time instead of their sum.
ensure_venv &
venv_pid=$!
engine_status=0
{ ensure_docker && bash "$ROOT/scripts/base-images.sh"; } || engine_status=$?   # its default list; more: scripts/base-images.sh --list
wait "$venv_pid" || die "the virtualenv could not be made (see above)"
[ "$engine_status" = 0 ] || exit "$engine_status"
if [ -n "$HARBOR_LINE" ]; then ensure_harbor_venv "$HARBOR_LINE"; fi
ensure_guard
ensure_registry
log "ready"
if [ ${#THEN[@]} -gt 0 ]; then exec "${THEN[@]}"; fi
