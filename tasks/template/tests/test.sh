#!/bin/bash
# Harbor ignores this script's exit code: only /logs/verifier/reward.txt counts.
# Stand-alone check used by oracle validation of the template; in template mode the
# rollout's grader may replace it.
set -u
mkdir -p /logs/verifier

answer=$(tr -d '[:space:]' 2>/dev/null < /workspace/answer.txt || true)
if [ "$answer" = osmosis ]; then
    echo "PASS: /workspace/answer.txt holds 'osmosis'"
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: /workspace/answer.txt holds '${answer}', expected 'osmosis'"
    echo 0 > /logs/verifier/reward.txt
fi
