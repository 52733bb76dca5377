"""Graft the shim, a generated entry module and console scripts into a built wheel.

The result is written reproducibly: entries sorted (``.dist-info`` last, ``RECORD``
at the very end), every timestamp 1980-01-01 00:00:00, fixed permissions, fixed
compression, and a ``RECORD`` recomputed over the final bytes.
"""

from __future__ import annotations

import base64
import configparser
import csv
import email.parser
import email.policy
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from osmosis_harbor.bundle.requirements import is_host_only
from osmosis_harbor.bundle.shim import SHIM_PACKAGE, Shim
from osmosis_harbor.bundle.targets import Targets
from osmosis_harbor.errors import BundleError

__all__ = [
    "BUNDLE_METADATA",
    "WheelMetadata",
    "agent_script_name",
    "grade_script_name",
    "entry_module_name",
    "graft",
    "read_entries",
    "read_metadata",
    "dist_info_dir",
    "write_wheel",
]

BUNDLE_METADATA = "osmosis_bundle.json"  # inside the .dist-info directory
ZIP_DATE = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o644
SCRIPT_MODE = 0o755
_SIGNATURES = ("RECORD", "RECORD.jws", "RECORD.p7s")


def agent_script_name(package: str) -> str:
    return f"{package.replace('_', '-')}-agent"


def grade_script_name(package: str) -> str:
    return f"{package.replace('_', '-')}-grade"


def entry_module_name(package: str) -> str:
    return f"_osmosis_bundle_{package}"


@dataclass(frozen=True)
class WheelMetadata:
    name: str
    version: str
    requires_dist: list[str]


def read_entries(path: Path) -> dict[str, bytes]:
    """Every file of the wheel at *path* (directory entries dropped)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return {info.filename: zf.read(info) for info in zf.infolist() if not info.is_dir()}
    except (OSError, zipfile.BadZipFile) as exc:
        raise BundleError(f"{path} is not a readable wheel ({exc}); rebuild it") from None


def dist_info_dir(entries: dict[str, bytes], wheel: Path) -> str:
    found = sorted({name.split("/", 1)[0] for name in entries if name.split("/", 1)[0].endswith(".dist-info")})
    if len(found) != 1:
        raise BundleError(f"{wheel} has {len(found)} .dist-info directories instead of one: not a valid wheel")
    return found[0]


def read_metadata(entries: dict[str, bytes], dist_info: str, wheel: Path) -> WheelMetadata:
    raw = entries.get(f"{dist_info}/METADATA")
    if raw is None:
        raise BundleError(f"{wheel} has no {dist_info}/METADATA; it is not a valid wheel")
    message = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(raw)
    return WheelMetadata(
        name=str(message["Name"]),
        version=str(message["Version"]),
        requires_dist=[str(r) for r in message.get_all("Requires-Dist") or []],
    )


def graft(
    entries: dict[str, bytes],
    *,
    wheel: Path,
    package: str,
    shim: Shim,
    targets: Targets,
    bundle_metadata: dict,
) -> dict[str, bytes]:
    """Return the entries of the bundle wheel built from the project's wheel *entries*."""
    dist_info = dist_info_dir(entries, wheel)
    module = entry_module_name(package)
    if not any(name.startswith(f"{package}/") for name in entries):
        raise BundleError(
            f"the wheel built from the project does not contain its package {package!r}; make the build "
            f'backend include it (e.g. [tool.setuptools] packages = ["{package}"])'
        )
    clashes = sorted(n for n in entries if n.startswith(f"{SHIM_PACKAGE}/") or n == f"{module}.py")
    if clashes:
        raise BundleError(f"the project's wheel already contains {clashes[0]}, a name reserved for the bundle")
    out = {name: data for name, data in entries.items() if name not in {f"{dist_info}/{s}" for s in _SIGNATURES}}
    out[f"{dist_info}/METADATA"] = without_host_requirements(entries[f"{dist_info}/METADATA"])
    for rel, source in shim.files.items():
        out[f"{SHIM_PACKAGE}/{rel}"] = source
    out[f"{module}.py"] = _entry_module(targets).encode()

    scripts = {}
    if targets.workflow:
        scripts[agent_script_name(package)] = f"{module}:agent_main"
    if targets.grader:
        scripts[grade_script_name(package)] = f"{module}:grade_main"
    ep_name = f"{dist_info}/entry_points.txt"
    out[ep_name] = _add_console_scripts(entries.get(ep_name, b"").decode(), scripts, wheel).encode()

    top_level = f"{dist_info}/top_level.txt"
    if top_level in out:  # setuptools' informational list of top-level names
        names = set(out[top_level].decode().split()) | {module, SHIM_PACKAGE}
        out[top_level] = "".join(f"{n}\n" for n in sorted(names)).encode()
    metadata = json.dumps(bundle_metadata, indent=2, sort_keys=True) + "\n"
    out[f"{dist_info}/{BUNDLE_METADATA}"] = metadata.encode()
    return out


def without_host_requirements(metadata: bytes) -> bytes:
    """``METADATA`` without the ``Requires-Dist`` headers of host-only packages
    (``requirements.HOST_ONLY``), so that pip in the sandbox never tries to install them."""
    head, blank, body = metadata.partition(b"\n\n")
    kept: list[bytes] = []
    dropping = False
    for line in head.split(b"\n"):
        if line[:1] in (b" ", b"\t"):  # a folded header continues the one above
            if not dropping:
                kept.append(line)
            continue
        name, _, value = line.partition(b":")
        dropping = name.strip().lower() == b"requires-dist" and is_host_only(value.strip().decode())
        if not dropping:
            kept.append(line)
    return b"\n".join(kept) + blank + body


def _entry_module(targets: Targets) -> str:
    """The console scripts' module: each script runs its phase in the shim."""
    return f'''"""Console entry points of this Osmosis bundle (generated by osmosis-harbor; do not edit)."""

WORKFLOW = {targets.workflow!r}
WORKFLOW_CONFIG = {targets.workflow_config!r}
GRADER = {targets.grader!r}
GRADER_CONFIG = {targets.grader_config!r}


def agent_main():
    import {SHIM_PACKAGE}.agent

    raise SystemExit({SHIM_PACKAGE}.agent.main(workflow=WORKFLOW, workflow_config=WORKFLOW_CONFIG))


def grade_main():
    import {SHIM_PACKAGE}.verifier

    raise SystemExit({SHIM_PACKAGE}.verifier.main(grader=GRADER, grader_config=GRADER_CONFIG))
'''


def _add_console_scripts(text: str, scripts: dict[str, str], wheel: Path) -> str:
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep the case of script names
    parser.read_string(text)
    if not parser.has_section("console_scripts"):
        parser.add_section("console_scripts")
    for name, target in scripts.items():
        existing = parser.get("console_scripts", name, fallback=None)
        if existing is not None:
            raise BundleError(
                f"the project already defines the console script {name!r} (= {existing}); the bundle needs "
                "that name for its runner: rename the project's script in [project.scripts]"
            )
        parser.set("console_scripts", name, target)
    return "\n".join(
        f"[{section}]\n" + "".join(f"{key} = {value}\n" for key, value in parser.items(section, raw=True))
        for section in parser.sections()
    )


def _record(entries: dict[str, bytes], dist_info: str) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for name in _ordered(entries, dist_info):
        digest = base64.urlsafe_b64encode(hashlib.sha256(entries[name]).digest()).rstrip(b"=").decode()
        writer.writerow((name, f"sha256={digest}", len(entries[name])))
    writer.writerow((f"{dist_info}/RECORD", "", ""))
    return buf.getvalue().encode()


def _ordered(entries: dict[str, bytes], dist_info: str) -> list[str]:
    """Package files first, then .dist-info (so RECORD, appended last, ends the archive)."""
    return sorted(entries, key=lambda n: (n.startswith(f"{dist_info}/"), n))


def write_wheel(path: Path, entries: dict[str, bytes]) -> None:
    """Write *entries* (without RECORD) plus a fresh RECORD as a byte-reproducible wheel."""
    dist_info = dist_info_dir(entries, path)
    entries = {n: d for n, d in entries.items() if n != f"{dist_info}/RECORD"}
    record = _record(entries, dist_info)
    with zipfile.ZipFile(path, "w") as zf:
        for name in [*_ordered(entries, dist_info), f"{dist_info}/RECORD"]:
            data = record if name == f"{dist_info}/RECORD" else entries[name]
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            info.create_system = 3  # Unix, so external_attr means st_mode everywhere
            mode = SCRIPT_MODE if ".data/scripts/" in name else FILE_MODE
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=9)
