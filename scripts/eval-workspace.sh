#!/usr/bin/env bash
# Make a new Osmosis workspace from examples/eval_workspace, ready for `osmosis eval run`:
#   bash scripts/eval-workspace.sh DEST
# It copies the example to DEST (which must not exist yet), points the rollout's dev dependency
# on osmosis-harbor at this checkout (an editable path source: the harness's `uv sync` installs
# it for the rollout server; the sandbox never sees it), and makes DEST a git repository (the
# harness finds a workspace by its git top level).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:?usage: bash scripts/eval-workspace.sh DEST}"
[ ! -e "$DEST" ] || { echo "error: $DEST exists; name a new directory" >&2; exit 2; }

cp -r "$ROOT/examples/eval_workspace" "$DEST"
find "$DEST" -name __pycache__ -type d -prune -exec rm -rf {} +
PYPROJECT="$DEST/rollouts/calc/pyproject.toml"
ESCAPED="$(printf '%s' "$ROOT" | sed 's/[\\&|]/\\&/g')"
sed -i "s|^osmosis-harbor = { path = \"[^\"]*\"|osmosis-harbor = { path = \"$ESCAPED\"|" "$PYPROJECT"
grep -q "path = \"$ROOT\"" "$PYPROJECT" || { echo "error: could not point $PYPROJECT at $ROOT" >&2; exit 1; }
git -C "$DEST" init -q
echo "workspace ready: $DEST"
echo "next: cd $DEST && osmosis eval run configs/eval/calc.toml --dataset-file data/calc.jsonl -y"
