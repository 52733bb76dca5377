#!/usr/bin/env bash
# Make the public base images that tasks build FROM available to the local Docker engine.
#
# Why: no image registry (Docker Hub, ghcr) is reachable from this kind of machine, so
# `FROM ubuntu:24.04` can only be satisfied by an image that is already present. For each
# requested image that is missing and cannot be pulled, we build a *stand-in* from Debian's
# archive (the only distribution archive reachable here) and give it the public name:
#
#   1. once per Debian suite: debootstrap a minimal root file system (cached as a tarball),
#      add the host CA bundle and uv, and `docker import` it          -> the debian:*-slim stand-ins
#   2. once per suite: a layer with python3, pip, venv and curl from apt
#   3. per public name: a tiny `docker build` (labels, the `python` alias, an `ubuntu` user...)
#
# The host CA bundle is copied to /etc/ssl/host-ca.crt (a path the ca-certificates package
# never regenerates) and pip, requests, OpenSSL and uv are told to trust it, so PyPI works
# inside containers behind this machine's TLS proxy.
#
# Usage (python -m osmosis_harbor base-images ARGS runs this file from the installed package;
# scripts/base-images.sh ARGS from a checkout):
#   base-images [IMAGE ...]   make these present (default: what bootstrap and the tests use)
#   base-images --all         make every stand-in present
#   base-images --list        every stand-in: what it really is, and whether it is present
#   base-images --names       every name with a recipe, one a line (no Docker call: cheap)
#   base-images --rootfs SUITE  only build (or reuse) the cached root file system of a suite
# Idempotent: an image that already exists is skipped in milliseconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"   # the checkout, when run from one
LIST_HINT="python -m osmosis_harbor base-images --list"
DEFAULT_IMAGES=(debian:trixie-slim python:3.12-slim ubuntu:24.04 python:3.13-slim)  # bundled tasks + tests
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
CACHE="${OSMOSIS_HARBOR_CACHE:-$HOME/.cache/osmosis-harbor}"
# Not under /tmp: a root file system is large, holds device nodes and mounts while debootstrap
# runs, and /tmp is shared with (and cleaned by) others.
ROOTFS_DIR="$CACHE/rootfs"
UV_SPEC="${UV_VERSION:+==$UV_VERSION}"     # empty: the newest uv on PyPI when the rootfs is built
REVISION=r1                                 # bump when a recipe changes: new names, new caches
STANDIN_REPO=osmosis-harbor/stand-in        # the intermediate (per-suite) images
LABEL=osmosis-harbor.stand-in

declare -A SUITE_VERSION=([bookworm]=12 [trixie]=13)
declare -A SUITE_PYTHON=([bookworm]=3.11 [trixie]=3.13)

# Public name -> "SUITE FLAVOUR". Python tags take the suite with the closest Python
# (bookworm: 3.11, trixie: 3.13; Debian has no 3.12, so 3.12 keeps the tag's suite, else
# trixie like the official image); the tag's suite only breaks that tie. Ubuntu 22.04
# (Python 3.10) maps to bookworm, 24.04 (Python 3.12) to trixie.
RECIPES=(
  "debian:bookworm-slim       bookworm debian"
  "debian:trixie-slim         trixie   debian"
  "ubuntu:22.04               bookworm ubuntu-22.04"
  "ubuntu:jammy               bookworm ubuntu-22.04"
  "ubuntu:24.04               trixie   ubuntu-24.04"
  "ubuntu:noble               trixie   ubuntu-24.04"
  "python:3.11-slim           bookworm python"
  "python:3.11-slim-bookworm  bookworm python"
  "python:3.11-slim-trixie    bookworm python"
  "python:3.12-slim           trixie   python"
  "python:3.12-slim-bookworm  bookworm python"
  "python:3.12-slim-trixie    trixie   python"
  "python:3.13-slim           trixie   python"
  "python:3.13-slim-bookworm  trixie   python"
  "python:3.13-slim-trixie    trixie   python"
)

log() { printf '[base-images] %s\n' "$*" >&2; }
die() { printf '[base-images] error: %s\n' "$*" >&2; exit 1; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# recipe NAME -> "SUITE FLAVOUR" on stdout, or status 1
recipe() {
  local line name suite flavour
  for line in "${RECIPES[@]}"; do
    read -r name suite flavour <<<"$line"
    if [ "$name" = "$1" ]; then echo "$suite $flavour"; return 0; fi
  done
  return 1
}

recipe_names() {
  local line
  for line in "${RECIPES[@]}"; do echo "${line%% *}"; done
}

# ── root file system (debootstrap), safe against interruption ───────────────
BUILD_DIR=""   # the build in progress, removed on any exit
CHILD=""       # debootstrap's pid (= its process group: it runs under setsid)

mounts_under() {  # DIR -> mount points at or below DIR, deepest first
  awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r
}

cleanup_build() {
  if [ -n "$CHILD" ]; then
    kill -TERM -- "-$CHILD" 2>/dev/null || true
    wait "$CHILD" 2>/dev/null || true
    CHILD=""
  fi
  [ -n "$BUILD_DIR" ] || return 0
  local mnt
  for mnt in $(mounts_under "$BUILD_DIR"); do
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  done
  if [ -n "$(mounts_under "$BUILD_DIR")" ]; then
    log "error: could not unmount everything under $BUILD_DIR; not removing it"
    return 1
  fi
  rm -rf --one-file-system "$BUILD_DIR"
  BUILD_DIR=""
}

trap 'cleanup_build' EXIT
trap 'log "interrupted"; cleanup_build; exit 130' INT
trap 'log "terminated"; cleanup_build; exit 143' TERM

ensure_debootstrap() {
  command -v debootstrap >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  else
    die "debootstrap is missing: install it (apt-get install debootstrap) or pull the images yourself"
  fi
}

host_python() {  # a Python with pip, to fetch the uv wheel from PyPI
  local py
  for py in ${HOST_PYTHON:+"$HOST_PYTHON"} "$ROOT/.venv/bin/python" python3; do  # HOST_PYTHON: set by the CLI verb
    if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
      echo "$py"; return 0
    fi
  done
  die "no Python with pip on this machine to download uv from PyPI (run scripts/bootstrap.sh)"
}

# uv and uvx from the PyPI wheel into ROOTFS/root/.local/bin, plus the `env` files uv's
# installer writes there, so `curl -LsSf https://astral.sh/uv/install.sh | sh; source
# $HOME/.local/bin/env` (which cannot download anything offline) still leaves a working uv.
install_uv() {
  local rootfs="$1" py wheel bin="$1/root/.local/bin"
  py="$(host_python)"
  if ! "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --dest "$BUILD_DIR/wheel" "uv$UV_SPEC" >"$BUILD_DIR/pip.log" 2>&1; then
    tail -20 "$BUILD_DIR/pip.log" >&2
    die "could not download uv$UV_SPEC from PyPI"
  fi
  wheel="$(ls "$BUILD_DIR"/wheel/uv-*.whl)"
  mkdir -p "$bin"
  "$py" - "$wheel" "$bin" <<'PY'
import sys, zipfile
from pathlib import Path
wheel, dest = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as zf:
    for member in zf.namelist():
        if member.split("/")[-2:-1] == ["scripts"] and member.rsplit("/", 1)[-1] in ("uv", "uvx"):
            target = dest / member.rsplit("/", 1)[-1]
            target.write_bytes(zf.read(member))
            target.chmod(0o755)
PY
  [ -x "$bin/uv" ] && [ -x "$bin/uvx" ] || die "no uv/uvx binaries in $wheel"
  cat >"$bin/env" <<'SH'
#!/bin/sh
# add binaries to PATH if they aren't added yet
# affix colons on either side of $PATH to simplify matching
case ":${PATH}:" in
    *:"$HOME/.local/bin":*)
        ;;
    *)
        # Prepending path in case a system-installed binary needs to be overridden
        export PATH="$HOME/.local/bin:$PATH"
        ;;
esac
SH
  cat >"$bin/env.fish" <<'FISH'
if not contains "$HOME/.local/bin" $PATH
    # Prepending path in case a system-installed binary needs to be overridden
    set -x PATH "$HOME/.local/bin" $PATH
end
FISH
  log "uv $(basename "$wheel" | cut -d- -f2) in /root/.local/bin"
}

# The host CA bundle at a path of its own (the variables below point at it) and in the system
# store, via /usr/local/share/ca-certificates so that a task's own `apt-get install
# ca-certificates` keeps it: tools that ignore the variables (git, wget, uv --system-certs
# with SSL_CERT_FILE unset) trust the proxy too.
install_host_ca() {
  local rootfs="$1"
  [ -f "$HOST_CA" ] || { log "no host CA bundle at $HOST_CA: containers trust Debian's roots only"; return 0; }
  cp "$HOST_CA" "$rootfs/etc/ssl/host-ca.crt"
  cp "$HOST_CA" "$rootfs/usr/local/share/ca-certificates/host-ca.crt"
  chroot "$rootfs" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the $rootfs chroot"
}

# build_rootfs SUITE TARBALL: debootstrap, host CA, uv -> TARBALL
build_rootfs() {
  local suite="$1" tarball="$2" rootfs
  ensure_debootstrap
  mkdir -p "$ROOTFS_DIR"
  BUILD_DIR="$(mktemp -d "$ROOTFS_DIR/build-$suite.XXXXXX")"
  rootfs="$BUILD_DIR/root"
  log "debootstrap $suite from $MIRROR into $rootfs (about a minute)"
  # Its own session, so that we can stop it (and the dpkg it runs in the target) as a group.
  setsid debootstrap --variant=minbase --include=ca-certificates "$suite" "$rootfs" "$MIRROR" \
    >"$BUILD_DIR/debootstrap.log" 2>&1 &
  CHILD=$!
  if ! wait "$CHILD"; then
    CHILD=""
    tail -20 "$BUILD_DIR/debootstrap.log" >&2
    die "debootstrap $suite failed"
  fi
  CHILD=""
  install_host_ca "$rootfs"
  install_uv "$rootfs"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . >"$BUILD_DIR/rootfs.tar"
  mv "$BUILD_DIR/rootfs.tar" "$tarball"
  cleanup_build
}

# ensure_rootfs SUITE: TARBALL= the cached root file system (built once, reused by every
# stand-in). Not a $(...) subshell: the build's cleanup trap must run in this shell.
TARBALL=""
ensure_rootfs() {
  local suite="$1" lock
  [ -n "${SUITE_VERSION[$suite]:-}" ] || die "unknown Debian suite '$suite' (known: ${!SUITE_VERSION[*]})"
  TARBALL="$ROOTFS_DIR/$suite-stand-in-$REVISION.tar"
  mkdir -p "$ROOTFS_DIR"
  exec {lock}>"$ROOTFS_DIR/$suite.lock"
  flock "$lock"   # concurrent runs share one debootstrap
  [ -s "$TARBALL" ] || build_rootfs "$suite" "$TARBALL"
  exec {lock}>&-
}

# ── images ───────────────────────────────────────────────────────────────────
base_image() { echo "$STANDIN_REPO:$1-$REVISION"; }
python_image() { echo "$STANDIN_REPO:$1-python-$REVISION"; }

docker_build() {  # TAG, Dockerfile on stdin; output only on failure
  local tag="$1" out
  if ! out="$(DOCKER_BUILDKIT=0 docker build --force-rm -t "$tag" - 2>&1)"; then
    printf '%s\n' "$out" | tail -20 >&2
    die "docker build of $tag failed"
  fi
}

# Suite image: the root file system plus the settings every stand-in shares. uv reads
# SSL_CERT_FILE in every version; UV_SYSTEM_CERTS is the current name of its "trust the
# system store" switch (uv >= 0.11), UV_NATIVE_TLS the deprecated one that uv still honours
# and older uv (a task's pinned `pip install uv==0.7`) only knows. Python downloads come from
# GitHub, which is unreachable: uv says "no interpreter found" at once instead of retrying.
ensure_base() {
  local suite="$1" image
  image="$(base_image "$suite")"
  have_image "$image" && return 0
  ensure_rootfs "$suite"
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PIP_CERT=/etc/ssl/host-ca.crt' \
    --change 'ENV SSL_CERT_FILE=/etc/ssl/host-ca.crt' \
    --change 'ENV REQUESTS_CA_BUNDLE=/etc/ssl/host-ca.crt' \
    --change 'ENV UV_SYSTEM_CERTS=true' \
    --change 'ENV UV_NATIVE_TLS=true' \
    --change 'ENV UV_PYTHON_DOWNLOADS=never' \
    --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
    --change "LABEL $LABEL.distribution=debian/$suite $LABEL.revision=$REVISION" \
    --change 'CMD ["bash"]' \
    "$TARBALL" "$image" >/dev/null
  log "imported $image"
}

# Suite image + python3, pip, venv and curl from Debian's archive (the containers reach it).
ensure_python_layer() {
  local suite="$1" image
  image="$(python_image "$suite")"
  have_image "$image" && return 0
  ensure_base "$suite"
  log "adding python3, pip, venv and curl to $suite (apt)"
  docker_build "$image" <<EOF
FROM $(base_image "$suite")
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-pip python3-venv curl >/dev/null && rm -rf /var/lib/apt/lists/*
EOF
}

# What a task may notice of an image, asked of the image: "Debian 13 trixie, Python 3.13.5,
# OpenSSL 3.5.1". It becomes the stand-in's $LABEL.really label, which failure reports quote.
probe_facts() {
  docker run --rm --network none --entrypoint /bin/sh "$1" -c '
    . /etc/os-release 2>/dev/null
    facts="Debian ${VERSION_ID:-?} ${VERSION_CODENAME:-?}"
    py=$(python3 -c "import platform; print(platform.python_version())" 2>/dev/null) && facts="$facts, Python $py"
    ssl=$(openssl version 2>/dev/null | cut -d" " -f2) && [ -n "$ssl" ] && facts="$facts, OpenSSL $ssl"
    echo "$facts"' 2>/dev/null || echo "Debian"
}

# The per-name differences that the real images have and that tasks notice.
flavour_dockerfile() {
  local name="$1" suite="$2" flavour="$3" facts="$4"
  case "$flavour" in
    debian) echo "FROM $(base_image "$suite")" ;;
    python)
      # The official images' interpreter: `python` exists, `pip install` is allowed (no
      # PEP 668 marker), UTF-8 locale.
      echo "FROM $(python_image "$suite")"
      echo "RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && ln -s /usr/bin/python3 /usr/local/bin/python"
      echo "ENV LANG=C.UTF-8"
      ;;
    ubuntu-22.04)  # jammy's python3 has no PEP 668 marker
      echo "FROM $(python_image "$suite")"
      echo "RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED"
      ;;
    ubuntu-24.04)  # noble ships a default user `ubuntu` (uid 1000)
      echo "FROM $(python_image "$suite")"
      echo "RUN useradd --create-home --uid 1000 --user-group --shell /bin/bash --comment Ubuntu ubuntu"
      ;;
  esac
  echo "LABEL $LABEL=$name $LABEL.really=\"$facts\""
}

build_stand_in() {
  local name="$1" suite flavour from
  read -r suite flavour <<<"$(recipe "$name")"
  ensure_base "$suite"
  from="$(base_image "$suite")"
  if [ "$flavour" != debian ]; then ensure_python_layer "$suite"; from="$(python_image "$suite")"; fi
  flavour_dockerfile "$name" "$suite" "$flavour" "$(probe_facts "$from")" | docker_build "$name"
  log "built $name (stand-in: Debian ${SUITE_VERSION[$suite]} $suite)"
}

ensure_images() {
  local name todo=()
  for name in "$@"; do  # check every name before building anything
    if have_image "$name"; then
      log "$name present"
    elif timeout 20 docker pull -q "$name" >/dev/null 2>&1; then
      log "pulled $name"
    elif recipe "$name" >/dev/null; then
      todo+=("$name")
    else
      die "no recipe to build $name offline (stand-ins: $LIST_HINT)"
    fi
  done
  for name in "${todo[@]}"; do build_stand_in "$name"; done
}

# ── --list ───────────────────────────────────────────────────────────────────
# What a present image really is, asked of the image itself: "distribution/suite python".
probe_image() {
  docker run --rm --network none --entrypoint /bin/sh "$1" -c '
    . /etc/os-release 2>/dev/null
    py=$(python3 -c "import platform; print(platform.python_version())" 2>/dev/null || echo none)
    echo "${ID:-unknown}/${VERSION_CODENAME:-unknown} $py"' 2>/dev/null || echo "unknown/unknown unknown"
}

list_images() {
  local line name suite flavour really python local_state probes i=0
  probes="$(mktemp -d)"
  for line in "${RECIPES[@]}"; do  # probe the present images in parallel: ~1 s each
    read -r name suite flavour <<<"$line"
    i=$((i + 1))
    if have_image "$name"; then probe_image "$name" >"$probes/$i" & fi
  done
  wait
  i=0
  printf '%-26s %-16s %-8s %s\n' IMAGE REALLY PYTHON LOCAL
  for line in "${RECIPES[@]}"; do
    read -r name suite flavour <<<"$line"
    i=$((i + 1))
    if [ -f "$probes/$i" ]; then
      read -r really python <"$probes/$i"
      if [ "$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$name")" = "$name" ]; then
        local_state="present (stand-in)"
      else
        local_state="present (not built by this script)"
      fi
    else  # what the recipe will give
      really="debian/$suite"
      if [ "$flavour" = debian ]; then python=none; else python="${SUITE_PYTHON[$suite]}"; fi
      local_state="absent"
    fi
    printf '%-26s %-16s %-8s %s\n' "$name" "$really" "$python" "$local_state"
  done
  rm -rf "$probes"
}

usage() { sed -n '18,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

case "${1:-}" in
  --list) list_images ;;
  --names) recipe_names ;;
  --all) mapfile -t all < <(recipe_names); ensure_images "${all[@]}" ;;
  --rootfs) [ $# -eq 2 ] || die "usage: $0 --rootfs SUITE"; ensure_rootfs "$2"; echo "$TARBALL" ;;
  -h|--help) usage ;;
  -*) die "unknown option $1 (see --help)" ;;
  "") ensure_images "${DEFAULT_IMAGES[@]}" ;;
  *) ensure_images "$@" ;;
esac
