"""The process environment is read and written in ``osmosis_harbor/settings/`` only (and in the
shim, which runs in the sandbox and imports nothing of the host).

A knob read anywhere else escapes the settings model: no default in one place, no row in the
README's settings table, no way for a caller to carry one reading. Run by ``scripts/lint.sh``;
prints ``file:line: ...`` for each offending use and exits 1.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "osmosis_harbor"
ALLOWED = (PACKAGE / "settings", PACKAGE / "shim")
NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def offences(path: Path) -> list[tuple[int, str]]:
    """Each use of the environment in ``path``: ``os.<name>``, ``from os import <name>``, and an
    alias of ``os`` (``import os as o``) used the same way."""
    tree = ast.parse(path.read_text(), filename=str(path))
    os_names = {"os"}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names.update(alias.asname for alias in node.names if alias.name == "os" and alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found.extend((node.lineno, f"from os import {a.name}") for a in node.names if a.name in NAMES)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id in os_names
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def main() -> int:
    bad = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path.is_relative_to(allowed) for allowed in ALLOWED):
            continue
        for line, use in offences(path):
            print(
                f"{path.relative_to(ROOT)}:{line}: {use}: read the environment in osmosis_harbor/settings/ "
                "(a field of Settings, or its helpers) and carry the value"
            )
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
