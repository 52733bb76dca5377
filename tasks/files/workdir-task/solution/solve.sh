#!/bin/bash
# Uses relative paths only: it works only when started in /workspace/app.
set -euo pipefail
echo "cwd: $(pwd)"
if [ ! -f config.ini ]; then
    echo "config.ini not found in $(pwd): the task's workdir was not applied" >&2
    exit 1
fi
sed -i 's/^mode = draft$/mode = release/' config.ini
echo yes > RELEASED
