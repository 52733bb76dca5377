#!/bin/bash
# Harbor ignores this script's exit code: only /logs/verifier/reward.json counts.
# reward.json: {"reward": <0.0 or 1.0>, "fields_correct": <fraction of the 3 keys that are right>}
set -u
mkdir -p /logs/verifier

python3 - <<'PY'
import json
import math

with open("/data/numbers.txt") as f:
    numbers = [int(line) for line in f if line.strip()]
expected = {"count": len(numbers), "sum": sum(numbers), "mean": sum(numbers) / len(numbers)}

try:
    with open("/output/stats.json") as f:
        got = json.load(f)
    if not isinstance(got, dict):
        raise ValueError(f"not a JSON object: {got!r}")
except Exception as exc:  # missing file, bad JSON, wrong shape
    print(f"FAIL: cannot read /output/stats.json: {exc}")
    got = {}


def correct(key):
    value = got.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isclose(value, expected[key], rel_tol=1e-9, abs_tol=1e-9)


right = [key for key in expected if correct(key)]
print(f"expected {expected}, got {got}, correct keys: {right}")
rewards = {
    "reward": 1.0 if len(right) == len(expected) else 0.0,
    "fields_correct": len(right) / len(expected),
}
with open("/logs/verifier/reward.json", "w") as f:
    json.dump(rewards, f)
print(rewards)
PY

# Never leave the verifier without a reward file, even if python3 itself failed.
[ -s /logs/verifier/reward.json ] || echo '{"reward": 0.0, "fields_correct": 0.0}' > /logs/verifier/reward.json
