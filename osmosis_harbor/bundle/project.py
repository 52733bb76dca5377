"""The workflow project: ``pyproject.toml``, its one import package, its source files."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from osmosis_harbor.bundle.requirements import check_declared
from osmosis_harbor.errors import BundleError

__all__ = ["Project", "load_project", "declares_osmosis", "OSMOSIS_DISTRIBUTION", "CACHEDIR_TAG"]

OSMOSIS_DISTRIBUTION = "osmosis-ai"

# Never part of a build, at any depth: VCS metadata, tool caches, bytecode.
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".bzr",
        "__pycache__",
        ".venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        ".eggs",
        "node_modules",
    }
)
# Build outputs, only where build backends put them: the project root.
SKIP_ROOT_DIRS = frozenset({"build", "dist"})
SKIP_FILE_SUFFIXES = (".pyc", ".pyo")
SKIP_FILES = frozenset({".DS_Store"})
# Directories holding a Cache Directory Tag (bundle caches, .pytest_cache, ...) are skipped.
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
# Directories setuptools' flat-layout discovery never treats as packages.
NOT_PACKAGES = frozenset(
    {
        "test",
        "tests",
        "doc",
        "docs",
        "example",
        "examples",
        "script",
        "scripts",
        "tool",
        "tools",
        "bench",
        "benchmark",
        "benchmarks",
        "build",
        "dist",
        "venv",
        "env",
        "site-packages",
    }
)


@dataclass(frozen=True)
class Project:
    """A workflow project as read from disk (nothing of it imported)."""

    root: Path
    pyproject: dict[str, Any]
    package: str
    package_root: Path  # root, or root/src for a src layout
    files: tuple[str, ...] = field(repr=False)  # POSIX paths relative to root, sorted

    @property
    def name(self) -> str | None:
        return self.pyproject.get("project", {}).get("name")

    @property
    def dynamic_dependencies(self) -> bool:
        return "dependencies" in self.pyproject.get("project", {}).get("dynamic", [])


def load_project(code_dir: Path, *, exclude: Path | None = None) -> Project:
    """Read and check the project at *code_dir* (*exclude*: a cache dir inside it)."""
    root = Path(code_dir).resolve()
    if not root.is_dir():
        raise BundleError(f"code_dir {code_dir} is not a directory; pass the workflow project's directory")
    pyproject_path = root / "pyproject.toml"
    if not pyproject_path.is_file():
        raise BundleError(
            f"no pyproject.toml in {root}: a workflow project is a Python project; "
            "add a pyproject.toml with a [build-system] and a [project] table (see examples/calc_agent)"
        )
    try:
        pyproject = tomllib.loads(pyproject_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{pyproject_path} is not valid TOML ({exc}); fix its syntax") from None
    project_table = pyproject.get("project")
    if not isinstance(project_table, dict):
        raise BundleError(
            f"{pyproject_path} has no [project] table; declare name, version and dependencies "
            "there (PEP 621), including osmosis-ai"
        )
    if "dependencies" not in project_table.get("dynamic", []):
        _check_osmosis_dependency(project_table.get("dependencies", []), pyproject_path)
        check_declared(pyproject, pyproject_path)
    package, package_root = _find_package(root)
    files = tuple(_walk(root, exclude=exclude))
    return Project(root=root, pyproject=pyproject, package=package, package_root=package_root, files=files)


def declares_osmosis(requirements: list[str]) -> bool:
    """True when one of *requirements* names osmosis-ai (extras and markers aside)."""
    for spec in requirements:
        try:
            if canonicalize_name(Requirement(spec).name) == OSMOSIS_DISTRIBUTION:
                return True
        except InvalidRequirement:
            continue
    return False


def _check_osmosis_dependency(dependencies: Any, pyproject_path: Path) -> None:
    if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
        raise BundleError(f"[project].dependencies in {pyproject_path} must be a list of requirement strings")
    for spec in dependencies:
        try:
            Requirement(spec)
        except InvalidRequirement as exc:
            raise BundleError(
                f"[project].dependencies in {pyproject_path}: invalid requirement {spec!r} ({exc}); fix it"
            ) from None
    if not declares_osmosis(dependencies):
        raise BundleError(
            f"osmosis-ai is missing from [project].dependencies in {pyproject_path}: the sandbox installs "
            'the bundle with its dependencies, so add e.g. "osmosis-ai>=0.3.8,<0.4"'
        )


def _find_package(root: Path) -> tuple[str, Path]:
    """The project's single top-level import package (``src/`` layout when ``src/`` exists)."""
    base = root / "src" if (root / "src").is_dir() else root
    found = sorted(
        entry.name
        for entry in base.iterdir()
        if entry.is_dir()
        and entry.name.isidentifier()
        and entry.name not in NOT_PACKAGES
        and not entry.name.startswith((".", "_"))
        and (entry / "__init__.py").is_file()
    )
    if len(found) > 1:
        raise BundleError(
            f"{base} holds several top-level packages ({', '.join(found)}); a bundle is built from "
            "exactly one import package: move the others inside it or out of the project"
        )
    if not found:
        raise BundleError(
            f"no import package found in {base}: put the workflow code in a package directory "
            f"with an __init__.py (e.g. {base}/my_agent/__init__.py)"
        )
    return found[0], base


def _is_tagged_cache(path: Path) -> bool:
    try:
        with open(path / CACHEDIR_TAG, "rb") as fh:
            return fh.read(len(CACHEDIR_SIGNATURE)) == CACHEDIR_SIGNATURE
    except OSError:
        return False


def _walk(root: Path, *, exclude: Path | None) -> list[str]:
    """Every file that could go into the build, as sorted POSIX paths relative to *root*.

    Directory symlinks are refused: they would escape the tree the cache key describes.
    """
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        keep = []
        for name in dirnames:
            path = here / name
            if name in SKIP_DIRS or name.endswith(".egg-info"):
                continue
            if here == root and name in SKIP_ROOT_DIRS:
                continue
            if exclude is not None and path == exclude:
                continue
            if path.is_symlink():
                raise BundleError(
                    f"{path} is a symlinked directory inside the project; bundles are built from "
                    "real files only: replace it with a copy of the directory or move it out of the project"
                )
            if (path / "pyvenv.cfg").is_file() or _is_tagged_cache(path):
                continue  # a virtual environment or a cache, whatever its name
            keep.append(name)
        dirnames[:] = sorted(keep)
        for name in filenames:
            path = here / name
            if name in SKIP_FILES or name.endswith(SKIP_FILE_SUFFIXES):
                continue
            if path.is_symlink() and not path.exists():
                raise BundleError(f"{path} is a broken symlink in the project; remove it or point it at a file")
            if not path.is_file():
                continue  # sockets, fifos
            out.append(path.relative_to(root).as_posix())
    return sorted(out)
