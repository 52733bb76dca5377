#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import json

with open("/data/numbers.txt") as f:
    numbers = [int(line) for line in f if line.strip()]
stats = {"count": len(numbers), "sum": sum(numbers), "mean": sum(numbers) / len(numbers)}
with open("/output/stats.json", "w") as f:
    json.dump(stats, f)
print(stats)
PY
