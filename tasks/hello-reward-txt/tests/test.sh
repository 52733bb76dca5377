#!/bin/bash
# Harbor ignores this script's exit code: only /logs/verifier/reward.txt counts.
set -u
mkdir -p /logs/verifier

if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = 'Hello, world!' ]; then
    echo "PASS: /app/hello.txt holds the expected line"
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: /app/hello.txt is missing or differs"
    [ -f /app/hello.txt ] && { echo "--- got:"; cat /app/hello.txt; }
    echo 0 > /logs/verifier/reward.txt
fi
