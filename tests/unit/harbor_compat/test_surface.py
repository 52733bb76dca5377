"""Harbor's names we read, override or copy (``harbor_compat/surface.py``) still exist in the
installed Harbor with the shape we rely on, and the list is complete: every Harbor method our
environment overrides, every Harbor attribute it reads, every private name we import. A Harbor
release that changes one fails here, by name, instead of inside a trial. Each check is of the
installed Harbor line's entries (``surface_for``): CI runs this module on 0.25 and on 0.26."""

from __future__ import annotations

import ast
import inspect
import uuid
from pathlib import Path

import pytest
from harbor.environments.skypilot import SkypilotEnvironment

import osmosis_harbor
from osmosis_harbor.harbor_compat.shapes import assigned_in_init, current_shape, resolve, shape_of
from osmosis_harbor.harbor_compat.surface import BASE, SKY, SURFACE, HarborName, Use, surface_for
from osmosis_harbor.harbor_compat.version import HARBOR, LINES, line_of
from osmosis_harbor.sandbox import SandboxEnvironment
from tests.support.common import made_environment, make_task

PACKAGE = Path(osmosis_harbor.__file__).parent
HARBOR_ENVIRONMENT_OWNERS = {SKY, BASE}


def _listed(name: str, owners: set[str]) -> list[HarborName]:
    return [e for e in surface_for() if e.name == name and e.owner in owners]


def _harbor_owner(name: str) -> str | None:
    """The Harbor class our environment inherits ``name`` from, as ``module:Class``."""
    for cls in SandboxEnvironment.__mro__[1:]:
        if cls.__module__.startswith("harbor.") and name in vars(cls):
            return f"{cls.__module__}:{cls.__qualname__}"
    return None


@pytest.mark.parametrize("entry", surface_for(), ids=lambda e: e.label)
def test_each_harbor_name_still_has_the_shape_we_rely_on(entry: HarborName) -> None:
    assert current_shape(entry) == entry.shape, f"{entry.label} ({', '.join(entry.uses)} in {entry.where}): {entry.why}"


def test_the_installed_line_is_a_supported_one_and_entries_name_only_known_lines() -> None:
    from importlib.metadata import version

    assert line_of(version("harbor")) is HARBOR
    assert line_of("0.25.1.dev202610260541").name == "0.25" and line_of("0.26.0").name == "0.26"
    with pytest.raises(ImportError, match="supports harbor 0.25 and 0.26"):
        line_of("0.27.0")
    assert {line for e in SURFACE for line in e.lines} == set(LINES)
    # Where the lines differ, each has its own entry: one name never has two on one line.
    for line in LINES:
        labels = [e.label for e in surface_for(line)]
        assert len(labels) == len(set(labels)), line
    assert len(surface_for("0.25")) != len(surface_for("0.26"))  # control: the filter filters


def test_the_check_fails_on_a_changed_shape_and_a_missing_name() -> None:
    """Control: the comparison above can fail."""
    reshaped = HarborName(SKY, "_create_sandbox", "(self, image, pool)", (Use.OVERRIDE,), "here", "control")
    gone = HarborName(SKY, "_no_such_method", "(self)", (Use.CALL,), "here", "control")
    unset = HarborName(SKY, "_no_such_attribute", "attribute", (Use.SET,), "here", "control")
    assert current_shape(reshaped) == "(self, image)"
    assert current_shape(gone) == current_shape(unset) == "missing"


def test_ours_is_a_base_environment_of_its_own_and_takes_every_skypilot_keyword(tmp_path: Path) -> None:
    """Ours implements Harbor's ``BaseEnvironment`` itself: no Harbor environment class but the
    base is in its ancestry, and it takes every keyword Harbor's SkyPilot class does."""
    harbor_bases = [c for c in SandboxEnvironment.__mro__ if c.__module__.startswith("harbor.")]
    assert harbor_bases == [resolve(BASE)] and not issubclass(SandboxEnvironment, SkypilotEnvironment)
    env = made_environment(make_task(tmp_path, "surface"), tmp_path / f"trial-{uuid.uuid4().hex[:6]}", "surface")
    # Ours takes every keyword Harbor's does (an environment kwarg Harbor adds is not dropped):
    # its __init__'s on 0.25, its options model's fields on 0.26.
    ours = set(inspect.signature(SandboxEnvironment.__init__).parameters)
    if HARBOR.options_model:
        # suppress_override_warnings: deprecated by Harbor, no effect; ours refuses it on both lines
        harbor_keywords = set(vars(SkypilotEnvironment)["options_model"].model_fields) - {"suppress_override_warnings"}
        assert {"pool", "registry", "auto_mounting"} <= harbor_keywords  # control
        assert harbor_keywords <= ours & set(type(env.options).model_fields)
    else:
        harbor_keywords = set(inspect.signature(SkypilotEnvironment.__init__).parameters) - {"kwargs"}
        assert harbor_keywords <= ours


def _our_overrides() -> dict[str, object]:
    """Every name our environment class defines (its collaborators are not Harbor's subclasses)."""
    ours: dict[str, object] = {}
    for cls in reversed(SandboxEnvironment.__mro__):
        if cls.__module__.startswith("osmosis_harbor."):
            ours.update(vars(cls))
    return ours


def test_every_harbor_method_we_override_is_listed_with_harbors_shape() -> None:
    assert "download_dir_filtered" in _our_overrides()  # control: the overrides are seen
    for name, ours in _our_overrides().items():
        owner = _harbor_owner(name)
        if owner is None or name.startswith("_abc") or (name.startswith("__") and name != "__init__"):
            continue
        entries = _listed(name, {owner})
        assert entries, (
            f"{owner}.{name} is overridden in sandbox/environment/sandbox_environment.py but not listed in harbor_compat/surface.py"
        )
        if name == "__init__":
            continue
        assert Use.OVERRIDE in entries[0].uses, f"{owner}.{name} is overridden, listed as {entries[0].uses}"
        if callable(ours) and not isinstance(ours, type):
            assert shape_of(getattr(SandboxEnvironment, name)) == entries[0].shape, f"our {name} differs from Harbor's"


def _private_reads(source: str) -> set[str]:
    """``_name`` read on self, super(), a Harbor environment class, or ``env`` in ``source``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        base = node.value
        if (
            (isinstance(base, ast.Name) and base.id in {"self", "env", "BaseEnvironment", "SkypilotEnvironment"})
            or isinstance(base, ast.Call)
            and isinstance(base.func, ast.Name)
            and base.func.id == "super"
        ):
            names.add(node.attr)
    return names


def test_every_harbor_private_name_our_environment_touches_is_listed() -> None:
    base = resolve(BASE)
    harbor_attributes = assigned_in_init(base)
    # The environment and its collaborators, which reach Harbor through calls it hands them.
    ours = {*(PACKAGE / "sandbox" / "environment").glob("*.py"), PACKAGE / "sandbox" / "transfer" / "filtered.py"}
    assert PACKAGE / "sandbox" / "environment" / "own_sandbox.py" in ours  # control: collaborators are scanned
    reads: set[str] = set()
    for source in ours:
        reads |= _private_reads(Path(str(source)).read_text())
    harbor_names = {n for n in reads if hasattr(base, n) or n in harbor_attributes}
    assert {"_resolve_user", "_persistent_env", "_empty_dirs_command"} <= harbor_names  # control: the scan sees them
    missing = sorted(n for n in harbor_names if not _listed(n, HARBOR_ENVIRONMENT_OWNERS))
    assert not missing, (
        f"sandbox/environment/sandbox_environment.py touches Harbor's {missing}, not listed in harbor_compat/surface.py"
    )


def test_every_name_imported_from_harbor_exists_and_private_ones_are_listed() -> None:
    imports: list[tuple[str, str, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "harbor":
                imports += [(str(path.relative_to(PACKAGE)), node.module or "", alias.name) for alias in node.names]
    assert any(name == "_selected_rules" for _, _, name in imports)  # control: lazy imports are seen
    gone = [f"{where}: {module}.{name}" for where, module, name in imports if not hasattr(resolve(module), name)]
    assert not gone, f"Harbor no longer has {gone}"
    unlisted = [
        f"{where}: {module}.{name}"
        for where, module, name in imports
        if name.startswith("_") and not _listed(name, {module})
    ]
    assert not unlisted, f"private Harbor names imported but not listed in harbor_surface: {unlisted}"
