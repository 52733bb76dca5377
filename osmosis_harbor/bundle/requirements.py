"""What of a workflow project's dependencies the sandbox installs, and what it cannot.

The sandbox installs the bundle wheel's ``Requires-Dist`` with pip from an index. So the host's
own packages (osmosis-harbor, Harbor, the Docker SDK: what serves and schedules trials, never
what runs in them) are left out, whatever their extras or source. A dependency that only
exists on this machine (a path, a ``file://`` URL, an editable or ``[tool.uv.sources]`` entry)
would fail the image build, or silently install something else from the index: it is refused
before anything is built, with the place it belongs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from osmosis_harbor.errors import BundleError

__all__ = ["HOST_ONLY", "check_declared", "is_host_only", "sandbox_requirements"]

HOST_ONLY = frozenset({"osmosis-harbor", "harbor", "docker"})
_WHERE_HOST_ONLY_GOES = "move it to [dependency-groups] dev if only the host needs it"


def is_host_only(spec: str) -> bool:
    """Whether ``spec`` names a host-side package (extras, markers and sources aside)."""
    try:
        return canonicalize_name(Requirement(spec).name) in HOST_ONLY
    except InvalidRequirement:
        return False


def _local(requirement: Requirement) -> str | None:
    """The local location a direct reference points at (``file:`` or a bare path), else None."""
    if requirement.url is None:
        return None
    scheme = urlparse(requirement.url).scheme.lower()
    return requirement.url if scheme in ("", "file") or len(scheme) == 1 else None  # "c:" is a drive


def check_declared(pyproject: Mapping[str, Any], path: Path) -> None:
    """Refuse, before any build, a static ``[project].dependencies`` entry the sandbox cannot
    install: a local direct reference, or one that ``[tool.uv.sources]`` redirects."""
    dependencies = pyproject.get("project", {}).get("dependencies", [])
    sources = pyproject.get("tool", {}).get("uv", {}).get("sources", {})
    sources = {canonicalize_name(name): value for name, value in sources.items()} if isinstance(sources, dict) else {}
    for spec in dependencies:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        if name in HOST_ONLY:
            continue
        if (location := _local(requirement)) is not None:
            raise BundleError(
                f"[project].dependencies in {path}: {spec!r} points at {location}, a path on this machine "
                f"that the sandbox does not have; depend on a published version instead, or "
                f"{_WHERE_HOST_ONLY_GOES}"
            )
        if (problem := _source_problem(sources.get(name))) is not None:
            raise BundleError(
                f"[tool.uv.sources] in {path} takes {requirement.name} from {problem}, but the sandbox "
                f"installs [project].dependencies with pip from an index, which would install another "
                f"{requirement.name} or none; {_remedy(problem)}"
            )


def _source_problem(source: Any) -> str | None:
    """What a ``[tool.uv.sources]`` entry (or list of entries) redirects a dependency to."""
    for entry in source if isinstance(source, list) else [source]:
        if not isinstance(entry, dict):
            continue
        if entry.get("editable") or "path" in entry:
            return f"the local path {entry.get('path', '?')}"
        if entry.get("workspace"):
            return "a uv workspace member"
        for kind in ("git", "url"):
            if kind in entry:
                return f"{kind} {entry[kind]}"
    return None


def _remedy(problem: str) -> str:
    if problem.startswith(("git ", "url ")):
        return "write it as a direct reference in [project].dependencies instead (name @ git+https://...)"
    return f"depend on a published version instead, or {_WHERE_HOST_ONLY_GOES}"


def sandbox_requirements(requires_dist: Iterable[str], label: str) -> list[str]:
    """The requirements the sandbox installs from a wheel's ``Requires-Dist``: extra-gated and
    host-only ones left out; a local direct reference (a dynamic dependency, or a build
    backend's path dependency) refused, naming ``label``."""
    kept = []
    for spec in requires_dist:
        try:
            requirement = Requirement(spec)
        except InvalidRequirement:
            kept.append(spec)  # pip judges it in the sandbox, as it would have before
            continue
        if (requirement.marker is not None and "extra" in str(requirement.marker)) or is_host_only(spec):
            continue
        if (location := _local(requirement)) is not None:
            raise BundleError(
                f"{label} requires {spec!r}, which points at {location}, a path on this machine that the "
                f"sandbox does not have; depend on a published version instead, or {_WHERE_HOST_ONLY_GOES}"
            )
        kept.append(spec)
    return kept
