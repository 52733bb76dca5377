"""What a bundle runs: workflow / grader classes and their configs as ``module:attr``.

Classes and config objects given as Python objects are turned into import paths
without importing anything new. The import paths are then checked by importing
them in a *subprocess* with the project on ``sys.path``, so the host process
never executes user code and an import-time error shows its own traceback.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from osmosis_harbor import settings
from osmosis_harbor.bundle.project import Project
from osmosis_harbor.errors import BundleError

__all__ = ["Targets", "resolve_targets", "verify_targets"]

logger = logging.getLogger(__name__)

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
IMPORT_PATH = re.compile(rf"^({_DOTTED}):({_DOTTED})$")
VERIFY_TIMEOUT_SEC = 120.0

# kind -> (the osmosis_ai class it must be / be an instance of, is it a config)
KINDS = {
    "workflow": ("AgentWorkflow", False),
    "workflow_config": ("AgentWorkflowConfig", True),
    "grader": ("Grader", False),
    "grader_config": ("GraderConfig", True),
}


@dataclass(frozen=True)
class Targets:
    workflow: str | None = None
    workflow_config: str | None = None
    grader: str | None = None
    grader_config: str | None = None

    def items(self) -> list[tuple[str, str]]:
        return [(kind, ref) for kind, ref in asdict(self).items() if ref is not None]


def resolve_targets(
    package: str,
    *,
    workflow: str | type | None,
    workflow_config: str | object | None,
    grader: str | type | None,
    grader_config: str | object | None,
) -> Targets:
    """Normalize every target to ``module:attr`` and check it lies inside *package*."""
    if workflow is None and grader is None:
        raise BundleError("nothing to bundle: pass workflow= (an AgentWorkflow) and/or grader= (a Grader)")
    if workflow is None and workflow_config is not None:
        raise BundleError("workflow_config= was given without workflow=; pass the workflow it configures")
    if grader is None and grader_config is not None:
        raise BundleError("grader_config= was given without grader=; pass the grader it configures")
    hints = [getattr(x, "__module__", None) for x in (workflow, grader) if isinstance(x, type)]
    targets = Targets(
        workflow=_class_path("workflow", workflow),
        grader=_class_path("grader", grader),
        workflow_config=_config_path("workflow_config", workflow_config, package, hints),
        grader_config=_config_path("grader_config", grader_config, package, hints),
    )
    for kind, ref in targets.items():
        module = ref.split(":", 1)[0]
        if module != package and not module.startswith(package + "."):
            raise BundleError(
                f"{kind} {ref!r} lives in module {module!r}, outside the project's package {package!r}; "
                f"move it into {package} (only that package is shipped in the bundle)"
            )
    return targets


def _class_path(kind: str, value: str | type | None) -> str | None:
    if value is None or isinstance(value, str):
        return _check_string(kind, value)
    if not isinstance(value, type):
        raise BundleError(
            f"{kind} must be a class or a 'module:Class' import path, got {type(value).__name__} {value!r}"
        )
    module, qualname = value.__module__, value.__qualname__
    if "<locals>" in qualname:
        raise BundleError(f"{kind} {qualname} is defined inside a function; define it at module level")
    if module == "__main__":
        raise BundleError(
            f"{kind} {qualname} is defined in __main__ (a script); move it into the project's package "
            "so the sandbox can import it"
        )
    return f"{module}:{qualname}"


def _config_path(kind: str, value: object, package: str, hints: list[str | None]) -> str | None:
    if value is None or isinstance(value, str):
        return _check_string(kind, value)
    # The config object was created by an already-imported module: look it up by
    # identity among the modules of the project's package (no import happens).
    candidates = [type(value).__module__, *hints]
    candidates += sorted(m for m in list(sys.modules) if m == package or m.startswith(package + "."))
    seen: set[str] = set()
    for name in candidates:
        if name is None or name in seen:
            continue
        seen.add(name)
        module = sys.modules.get(name)
        if module is None or (name != package and not name.startswith(package + ".")):
            continue
        for attr, bound in sorted(vars(module).items()):
            if bound is value and not attr.startswith("__"):
                return f"{name}:{attr}"
    raise BundleError(
        f"{kind}: config must be a module-level object of the project's package {package!r} "
        f"(no module-level name in {package} is bound to this {type(value).__name__}); assign it to a "
        f"module-level variable, or pass its import path 'module:name'"
    )


def _check_string(kind: str, value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not IMPORT_PATH.match(value):
        raise BundleError(f"{kind} {value!r} is not an import path; write it as 'package.module:Name'")
    return value


# Runs in the subprocess. argv: <json request> <result file>.
_PROBE = r"""
import importlib, inspect, json, os, sys, traceback
request = json.loads(sys.argv[1])
sys.path.insert(0, request["root"])
results = {}

def tail(exc):
    # Drop the frames of this probe and of importlib: the user's frames remain.
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.startswith("<") and "/importlib/" not in f.filename]
    )
    return "".join(te.format())[-3000:]

try:
    import osmosis_ai.rollout as rollout
except BaseException as exc:
    rollout = None
    fatal = tail(exc)
for kind, ref, expected, is_config in request["targets"]:
    if rollout is None:
        results[kind] = {"error": "osmosis", "detail": fatal}
        continue
    module_name, _, qualname = ref.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except BaseException as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        results[kind] = {"error": "import", "missing": missing, "detail": tail(exc)}
        continue
    file = getattr(obj, "__file__", None)
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        results[kind] = {"error": "attribute", "detail": part}
        continue
    base = getattr(rollout, expected)
    if is_config:
        ok = obj is None or isinstance(obj, base)
    else:
        ok = isinstance(obj, type) and issubclass(obj, base)
    if not ok:
        shown = repr(obj) if isinstance(obj, type) else "an instance of " + type(obj).__qualname__
        results[kind] = {"error": "kind", "detail": shown[:300]}
    elif not is_config and inspect.isabstract(obj):
        results[kind] = {"error": "abstract", "detail": ", ".join(sorted(obj.__abstractmethods__))}
    else:
        results[kind] = {"ok": True, "file": file}
with open(sys.argv[2], "w") as fh:
    json.dump(results, fh)
"""


def verify_targets(project: Project, targets: Targets) -> None:
    """Import every target in a subprocess and check its kind; raise :class:`BundleError`."""
    request = {
        "root": str(project.package_root),
        "targets": [(kind, ref, *KINDS[kind]) for kind, ref in targets.items()],
    }
    env = settings.child_environment(PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project.package_root), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="osmosis-bundle-probe-") as tmp:
        result_file = Path(tmp) / "result.json"
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE, json.dumps(request), str(result_file)],
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=VERIFY_TIMEOUT_SEC,
            )
        except subprocess.TimeoutExpired:
            raise BundleError(
                f"importing {', '.join(ref for _, ref in targets.items())} took more than "
                f"{VERIFY_TIMEOUT_SEC:.0f} s; remove slow work from module import time"
            ) from None
        if not result_file.is_file():
            output = (proc.stdout + proc.stderr)[-3000:]
            raise BundleError(
                f"importing the bundle targets of {project.root} killed the Python process "
                f"(exit code {proc.returncode}); fix the module-level code. Output tail:\n{output}"
            )
        results = json.loads(result_file.read_text())
    for kind, ref in targets.items():
        _judge(project, kind, ref, results[kind])


def _judge(project: Project, kind: str, ref: str, result: dict) -> None:
    module = ref.split(":", 1)[0]
    expected, is_config = KINDS[kind]
    error = result.get("error")
    if error is None:
        file = result.get("file")
        if file and not Path(file).resolve().is_relative_to(project.root):
            raise BundleError(
                f"{kind} {ref!r}: module {module!r} was imported from {file}, not from the project at "
                f"{project.root}; another installed copy of {project.package!r} shadows it: uninstall it"
            )
        return
    if error == "osmosis":
        raise BundleError(
            f"cannot check {kind} {ref!r}: osmosis_ai does not import in {sys.executable}; "
            f"install osmosis-ai in this environment. Traceback tail:\n{result['detail']}"
        )
    if error == "import":
        missing = result.get("missing") or ""
        if missing and (module == missing or module.startswith(missing + ".")):
            raise BundleError(
                f"{kind} {ref!r}: there is no module {missing!r} in the project ({project.package_root}); "
                "check the module part of the import path"
            )
        if missing and missing.split(".", 1)[0] != project.package:
            # A dependency of the project that this host does not have: the sandbox
            # installs [project].dependencies, so this is not an error here.
            logger.warning(
                "could not check %s %r on this host: module %r is not installed here; "
                "it must come from the project's [project].dependencies",
                kind,
                ref,
                missing,
            )
            return
        raise BundleError(
            f"{kind} {ref!r} is not importable from {project.package_root} (module {module!r} failed "
            f"to import); fix the error below. Traceback tail:\n{result['detail']}"
        )
    if error == "attribute":
        raise BundleError(f"{kind} {ref!r}: module {module!r} has no attribute {result['detail']!r}; check the name")
    if error == "abstract":
        raise BundleError(f"{kind} {ref!r} is abstract (unimplemented: {result['detail']}); implement those methods")
    if is_config:
        raise BundleError(
            f"{kind} {ref!r} is {result['detail']}: a config must be a module-level "
            f"osmosis_ai {expected} instance (or None); point {kind} at one"
        )
    raise BundleError(
        f"{kind} {ref!r} is {result['detail']}, not a subclass of osmosis_ai {expected}; "
        f"point {kind} at a class deriving from osmosis_ai.rollout.{expected}"
    )
