"""What a bundle wheel is, read back from its own metadata."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from osmosis_harbor.bundle.requirements import sandbox_requirements
from osmosis_harbor.bundle.wheel import (
    BUNDLE_METADATA,
    dist_info_dir,
    read_entries,
    read_metadata,
)
from osmosis_harbor.errors import BundleError

__all__ = ["BundleInfo", "inspect_bundle"]


class BundleInfo(BaseModel):
    """A bundle wheel and everything the backend needs to know about it."""

    model_config = ConfigDict(frozen=True)

    wheel: Path
    key: str
    package: str  # the import package, e.g. "calc_agent"
    distribution: str  # [project].name as in the wheel's METADATA
    version: str
    agent_script: str | None  # "<pkg>-agent", when a workflow is bundled
    grade_script: str | None  # "<pkg>-grade", when a grader is bundled
    workflow: str | None  # "module:attr" import paths
    workflow_config: str | None
    grader: str | None
    grader_config: str | None
    dependencies: list[str]  # what the sandbox installs: Requires-Dist, extra-gated and host-only ones left out
    shim_version: str

    @property
    def console_scripts(self) -> dict[str, str]:
        module = f"_osmosis_bundle_{self.package}"
        scripts = {}
        if self.agent_script:
            scripts[self.agent_script] = f"{module}:agent_main"
        if self.grade_script:
            scripts[self.grade_script] = f"{module}:grade_main"
        return scripts


def inspect_bundle(wheel: Path) -> BundleInfo:
    """Read a bundle wheel (e.g. a prebuilt one passed as ``bundle=``) from its metadata alone."""
    wheel = Path(wheel)
    if not wheel.is_file():
        raise BundleError(f"bundle {wheel} does not exist; build one with `python -m osmosis_harbor bundle`")
    if wheel.suffix != ".whl":
        raise BundleError(f"bundle {wheel} is not a .whl file; build one with `python -m osmosis_harbor bundle`")
    entries = read_entries(wheel)
    dist_info = dist_info_dir(entries, wheel)
    raw = entries.get(f"{dist_info}/{BUNDLE_METADATA}")
    if raw is None:
        raise BundleError(
            f"{wheel.name} is a wheel but not an Osmosis bundle (no {dist_info}/{BUNDLE_METADATA}); "
            "build it with `python -m osmosis_harbor bundle CODE_DIR --workflow module:Class`"
        )
    try:
        data = json.loads(raw)
        meta = read_metadata(entries, dist_info, wheel)
        info = BundleInfo(
            wheel=wheel.resolve(),
            key=data["key"],
            package=data["package"],
            distribution=meta.name,
            version=meta.version,
            agent_script=data.get("agent_script"),
            grade_script=data.get("grade_script"),
            workflow=data.get("workflow"),
            workflow_config=data.get("workflow_config"),
            grader=data.get("grader"),
            grader_config=data.get("grader_config"),
            dependencies=sandbox_requirements(meta.requires_dist, wheel.name),
            shim_version=data["shim_version"],
        )
    except BundleError:  # a requirement the sandbox cannot install: said as such
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{wheel.name}: unreadable bundle metadata ({exc}); rebuild the bundle") from None
    _check_scripts(entries, dist_info, info)
    return info


def _check_scripts(entries: dict[str, bytes], dist_info: str, info: BundleInfo) -> None:
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # typeshed: a method
    parser.read_string(entries.get(f"{dist_info}/entry_points.txt", b"").decode())
    for name, target in info.console_scripts.items():
        if parser.get("console_scripts", name, fallback=None) != target:
            raise BundleError(
                f"{info.wheel.name} does not declare the console script {name} = {target}; "
                "the wheel was modified after bundling: rebuild it"
            )
