#!/usr/bin/env bash
# The offline base-image stand-ins, for bootstrap and a checkout: the script ships inside the
# package (osmosis_harbor/sandbox/images/base-images.sh), which `python -m osmosis_harbor base-images`
# runs from anywhere. Same arguments, same output.
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/osmosis_harbor/sandbox/images/base-images.sh" "$@"
