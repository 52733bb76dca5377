"""The in-container runners (``osmosis_harbor/shim/``) as shipped in every bundle.

The shim's ``.py`` files are copied into the wheel as the top-level package
``osmosis_harbor_shim``. Its sources are read from disk (``find_spec`` locates
the directory without executing it); ``SHIM_VERSION`` is read from its
``__init__.py`` with :mod:`ast`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_harbor.errors import BundleError

__all__ = ["Shim", "load_shim", "SHIM_PACKAGE"]

SHIM_PACKAGE = "osmosis_harbor_shim"
SOURCE_PACKAGE = "osmosis_harbor.shim"
REQUIRED = ("__init__.py", "agent.py", "verifier.py")
_SELF_IMPORT = re.compile(r"\bosmosis_harbor\.shim\b")


@dataclass(frozen=True)
class Shim:
    version: str
    files: dict[str, bytes] = field(repr=False)  # path inside osmosis_harbor_shim/ -> source

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()


def shim_dir() -> Path:
    spec = importlib.util.find_spec(SOURCE_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise BundleError(f"{SOURCE_PACKAGE} is not installed; reinstall osmosis-harbor")
    return Path(locations[0])


def load_shim(directory: Path | None = None) -> Shim:
    """Read the shim sources (rewriting ``osmosis_harbor.shim`` to ``osmosis_harbor_shim``)."""
    directory = directory or shim_dir()
    missing = [name for name in REQUIRED if not (directory / name).is_file()]
    if missing:
        raise BundleError(
            f"the shim in {directory} is incomplete (missing {', '.join(missing)}); reinstall osmosis-harbor"
        )
    files: dict[str, bytes] = {}
    for path in sorted(directory.rglob("*.py")):
        rel = path.relative_to(directory)
        if "__pycache__" in rel.parts:
            continue
        text = _SELF_IMPORT.sub(SHIM_PACKAGE, path.read_text(encoding="utf-8"))
        _check_imports(rel, text)
        files[rel.as_posix()] = text.encode("utf-8")
    return Shim(version=_declared_version(files["__init__.py"]), files=files)


def _check_imports(rel: Path, text: str) -> None:
    """The shim runs where osmosis_harbor is not installed: it must not import it."""
    for node in ast.walk(ast.parse(text, filename=str(rel))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            if name.split(".", 1)[0] in {"osmosis_harbor", "harbor"}:
                raise BundleError(
                    f"shim module {rel} imports {name}, which does not exist in the sandbox; "
                    "the shim may import only the standard library, pydantic, osmosis_ai and itself"
                )


def _declared_version(init_source: bytes) -> str:
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in {"SHIM_VERSION", "__version__"}:
                    return str(node.value.value)
    raise BundleError(f"{SOURCE_PACKAGE}/__init__.py defines no SHIM_VERSION; reinstall osmosis-harbor")
