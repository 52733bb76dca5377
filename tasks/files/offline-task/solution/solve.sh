#!/bin/bash
set -euo pipefail
sha256sum /data/payload.bin | cut -d' ' -f1 > /data/payload.sha256
cat /data/payload.sha256
