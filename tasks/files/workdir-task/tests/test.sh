#!/bin/bash
# Harbor ignores this script's exit code: only /logs/verifier/reward.txt counts.
set -u
mkdir -p /logs/verifier

APP=/workspace/app
ok=1
check() {  # check <description> <command...>
    local what=$1; shift
    if "$@"; then echo "PASS: $what"; else echo "FAIL: $what"; ok=0; fi
}

check "verifier runs in $APP (cwd is $(pwd))" test "$(pwd)" = "$APP"
check "config.ini says mode = release" grep -qx 'mode = release' "$APP/config.ini"
check "config.ini no longer says mode = draft" bash -c "! grep -q 'mode = draft' '$APP/config.ini'"
check "config.ini keeps its other lines" grep -qx 'name = demo' "$APP/config.ini"
check "RELEASED holds yes" test "$(cat "$APP/RELEASED" 2>/dev/null)" = yes

echo "$ok" > /logs/verifier/reward.txt
