"""Harbor's private names (a leading underscore, imported from ``harbor``) are used in
``osmosis_harbor/harbor_compat/`` only.

Every Harbor release may rename or drop a private name; kept in one package, each one is listed
with the shape we rely on (``harbor_compat/surface*.py``) and a new Harbor line is checked in one
place. Run by ``scripts/lint.sh``; prints ``file:line: ...`` for each import elsewhere and exits 1.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "osmosis_harbor"
ALLOWED = PACKAGE / "harbor_compat"


def offences(path: Path) -> list[tuple[int, str]]:
    """Each ``from harbor... import _name`` in ``path`` (a dunder such as ``__version__`` is public)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if node.module != "harbor" and not node.module.startswith("harbor."):
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.endswith("__"):
                found.append((node.lineno, f"from {node.module} import {alias.name}"))
    return sorted(found)


def main() -> int:
    bad = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(ALLOWED):
            continue
        for line, use in offences(path):
            print(
                f"{path.relative_to(ROOT)}:{line}: {use}: reach Harbor's private names through osmosis_harbor/harbor_compat/"
            )
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
