"""Workflow project -> bundle wheel: built once, content-addressed, cached.

A bundle is the project's own wheel (built by its own build backend through the
PyPA ``build`` frontend) with three things grafted in:

* the in-container runners, ``osmosis_harbor/shim/`` copied as the top-level
  package ``osmosis_harbor_shim``;
* a generated module ``_osmosis_bundle_<pkg>`` holding the selected import paths
  and the functions ``agent_main`` / ``grade_main``;
* console scripts ``<pkg>-agent`` (and ``<pkg>-grade`` when a grader is bundled),
  plus ``osmosis_bundle.json`` in the ``.dist-info`` so :func:`inspect_bundle`
  can read everything back.

``pip install <wheel>`` in the sandbox is then all it takes to run the workflow.
The same inputs always give a byte-identical wheel at the same cache path.

Command line: ``python -m osmosis_harbor bundle CODE_DIR --workflow mod:Cls ...``
(``osmosis_harbor.cli.bundle``).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from osmosis_harbor.bundle.cache import (
    FORMAT_VERSION,
    cache_root,
    compute_key,
    find_cached,
    publish,
    workspace,
)
from osmosis_harbor.bundle.info import BundleInfo, inspect_bundle
from osmosis_harbor.bundle.pep517 import build_wheel
from osmosis_harbor.bundle.project import Project, declares_osmosis, load_project
from osmosis_harbor.bundle.requirements import sandbox_requirements
from osmosis_harbor.bundle.shim import load_shim
from osmosis_harbor.bundle.targets import Targets, resolve_targets, verify_targets
from osmosis_harbor.bundle.wheel import (
    agent_script_name,
    dist_info_dir,
    grade_script_name,
    graft,
    read_entries,
    read_metadata,
    write_wheel,
)
from osmosis_harbor.errors import BundleError

__all__ = ["BuildResult", "build", "build_bundle"]


@dataclass(frozen=True)
class BuildResult:
    info: BundleInfo
    cached: bool  # True: the cache already held this key, nothing was built
    isolated: bool | None  # how the project's wheel was built (None on a cache hit)
    seconds: float


def build_bundle(
    code_dir: Path,
    *,
    workflow: str | type | None,
    workflow_config: str | object | None = None,
    grader: str | type | None = None,
    grader_config: str | object | None = None,
    cache_dir: Path | None = None,
) -> BundleInfo:
    """Build (or fetch from the cache) the bundle wheel of the project at *code_dir*.

    ``workflow``/``grader`` are ``AgentWorkflow``/``Grader`` classes or their
    ``"module:Class"`` import paths; the configs are module-level config objects or
    their ``"module:name"`` paths. All of them must live in the project's package.
    The cache is *cache_dir*, else ``$OSMOSIS_HARBOR_BUNDLES``, else
    ``$XDG_CACHE_HOME/osmosis-harbor/bundles`` (never the working directory).
    Raises :class:`BundleError` on any problem with the project or the arguments.
    """
    return build(
        code_dir,
        workflow=workflow,
        workflow_config=workflow_config,
        grader=grader,
        grader_config=grader_config,
        cache_dir=cache_dir,
    ).info


def build(
    code_dir: Path,
    *,
    workflow: str | type | None,
    workflow_config: str | object | None = None,
    grader: str | type | None = None,
    grader_config: str | object | None = None,
    cache_dir: Path | None = None,
) -> BuildResult:
    """:func:`build_bundle`, also telling whether the cache answered and how long it took."""
    started = time.perf_counter()
    root = cache_root(cache_dir)
    code = Path(code_dir).resolve()
    if root.resolve() == code:
        raise BundleError(f"the bundle cache {root} is the project directory itself; pick another cache_dir")
    nested = root.resolve() if root.resolve().is_relative_to(code) else None
    project = load_project(code, exclude=nested)
    targets = resolve_targets(
        project.package,
        workflow=workflow,
        workflow_config=workflow_config,
        grader=grader,
        grader_config=grader_config,
    )
    shim = load_shim()
    key = compute_key(project, targets, shim)

    cached = find_cached(root, key)
    if cached is not None:
        info = inspect_bundle(cached)
        if info.key != key:
            raise BundleError(f"the bundle cache entry {cached.parent} holds another key; delete it and retry")
        return BuildResult(info, cached=True, isolated=None, seconds=time.perf_counter() - started)

    verify_targets(project, targets)
    with workspace(root, key) as tmp:
        stage = tmp / "source"
        for rel in project.files:
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(project.root / rel, stage / rel)
        built, isolated = build_wheel(stage, tmp / "dist", label=project.root)
        entries = read_entries(built)
        _check_built_dependencies(project, entries, built)  # before any image installs them
        grafted = graft(
            entries,
            wheel=built,
            package=project.package,
            shim=shim,
            targets=targets,
            bundle_metadata=_bundle_metadata(key, project, targets, shim.version, shim.digest),
        )
        entry = tmp / "entry"
        entry.mkdir()
        write_wheel(entry / built.name, grafted)
        wheel = publish(entry, root, key)
    seconds = time.perf_counter() - started
    return BuildResult(inspect_bundle(wheel), cached=False, isolated=isolated, seconds=seconds)


def _check_built_dependencies(project: Project, entries: dict[str, bytes], wheel: Path) -> None:
    """The built METADATA is what the sandbox installs: no dependency on a path of this machine
    (dynamic dependencies, or a build backend's own path dependencies, appear only there), and,
    with dynamic dependencies, osmosis-ai among them."""
    requires = read_metadata(entries, dist_info_dir(entries, wheel), wheel).requires_dist
    sandbox_requirements(requires, f"the wheel built from {project.root}")
    if not project.dynamic_dependencies:
        return
    if not declares_osmosis([r for r in requires if "extra" not in r.partition(";")[2]]):
        raise BundleError(
            f"osmosis-ai is missing from the dependencies of {project.root} (dynamic dependencies as "
            'built by its backend); add e.g. "osmosis-ai>=0.3.8,<0.4"'
        )


def _bundle_metadata(key: str, project: Project, targets: Targets, shim_version: str, shim_digest: str) -> dict:
    return {
        "format": FORMAT_VERSION,
        "key": key,
        "package": project.package,
        "shim_version": shim_version,
        "shim_digest": shim_digest,
        "agent_script": agent_script_name(project.package) if targets.workflow else None,
        "grade_script": grade_script_name(project.package) if targets.grader else None,
        "workflow": targets.workflow,
        "workflow_config": targets.workflow_config,
        "grader": targets.grader,
        "grader_config": targets.grader_config,
    }
