#!/usr/bin/env bash
# Make the base images the bundled tasks use available to the local Docker engine.
#
# Why: no image registry (Docker Hub, ghcr) is reachable from this kind of machine, so
# `FROM debian:trixie-slim` can only be satisfied by an image that is already present.
# For each image that is missing and cannot be pulled, we debootstrap a minimal Debian
# from the Debian archive and `docker import` it under the public name. The host CA
# bundle is copied in at /etc/ssl/host-ca.crt (a path the ca-certificates package never
# regenerates) and pip/requests/uv are told to trust it, so `pip install` from PyPI
# works inside containers behind this machine's TLS proxy.
#
# Idempotent: an image that already exists is skipped in milliseconds.
set -euo pipefail

IMAGES=("$@")
if [ ${#IMAGES[@]} -eq 0 ]; then
  IMAGES=(debian:trixie-slim python:3.12-slim)  # what the bundled tasks use
fi
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
CACHE="${OSMOSIS_HARBOR_CACHE:-$HOME/.cache/osmosis-harbor}/rootfs"

log() { printf '[base-images] %s\n' "$*" >&2; }

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

ensure_debootstrap() {
  command -v debootstrap >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  else
    log "debootstrap is missing: install it (apt-get install debootstrap) or pull the images yourself"
    exit 1
  fi
}

# debootstrap SUITE EXTRA_PACKAGES -> rootfs tarball on stdout
build_rootfs() {
  local suite="$1" extra="$2" dir
  dir="$(mktemp -d /tmp/osmosis-harbor-rootfs.XXXXXX)"
  log "debootstrap $suite (+ $extra) from $MIRROR"
  debootstrap --variant=minbase --include="ca-certificates,$extra" "$suite" "$dir" "$MIRROR" >/dev/null
  if [ -f "$HOST_CA" ]; then
    cp "$HOST_CA" "$dir/etc/ssl/host-ca.crt"
  fi
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  tar -C "$dir" -c .
  rm -rf "$dir"
}

# import NAME SUITE EXTRA_PACKAGES [extra docker import --change ...]
import_image() {
  local name="$1" suite="$2" extra="$3"; shift 3
  mkdir -p "$CACHE"
  local tarball="$CACHE/${suite}-$(echo "$extra" | tr ',' '_').tar"
  if [ ! -s "$tarball" ]; then
    build_rootfs "$suite" "$extra" >"$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
  fi
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PIP_CERT=/etc/ssl/host-ca.crt' \
    --change 'ENV SSL_CERT_FILE=/etc/ssl/host-ca.crt' \
    --change 'ENV REQUESTS_CA_BUNDLE=/etc/ssl/host-ca.crt' \
    --change 'ENV UV_NATIVE_TLS=1' \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
    --change 'CMD ["bash"]' \
    "$@" "$tarball" "$name" >/dev/null
  log "imported $name"
}

ensure_image() {
  local name="$1"
  if have_image "$name"; then
    log "$name present"
    return 0
  fi
  if timeout 20 docker pull -q "$name" >/dev/null 2>&1; then
    log "pulled $name"
    return 0
  fi
  ensure_debootstrap
  case "$name" in
    debian:trixie-slim)   import_image "$name" trixie "bash" ;;
    debian:bookworm-slim) import_image "$name" bookworm "bash" ;;
    # python:3.12-slim-compatible: Debian trixie ships python3 3.13; the tasks only need
    # `python3`, `pip` and `venv`, so we provide those (and `python` as an alias).
    python:3.12-slim)
      import_image "$name" trixie "bash,python3,python3-pip,python3-venv,python-is-python3" ;;
    *) log "no recipe to build $name offline"; exit 1 ;;
  esac
}

for image in "${IMAGES[@]}"; do
  ensure_image "$image"
done
