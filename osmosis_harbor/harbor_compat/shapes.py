"""What the installed Harbor has under a name of the surface, in the surface's terms: a
callable's parameter names and kinds, or the kind of attribute it is."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from functools import cached_property
from typing import Any

from osmosis_harbor.harbor_compat.names import HarborName

__all__ = ["assigned_in_init", "current_shape", "resolve", "shape_of"]


def resolve(owner: str) -> Any:
    """The Harbor module or class ``module[:Class]`` names (ImportError/AttributeError if gone)."""
    module, _, qualname = owner.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def shape_of(obj: Any) -> str:
    """A callable's parameter names and kinds, without annotations or defaults."""
    sig = inspect.signature(obj)
    params = [
        p.replace(annotation=inspect.Parameter.empty, default=inspect.Parameter.empty) for p in sig.parameters.values()
    ]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def assigned_in_init(cls: type) -> set[str]:
    """The ``self.<name>`` attributes ``cls.__init__`` itself assigns (read from its source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(vars(cls)["__init__"])))
    names: set[str] = set()
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


def current_shape(entry: HarborName) -> str:
    """What the installed Harbor has under ``entry``'s name, in ``entry.shape``'s terms."""
    owner = resolve(entry.owner)
    if entry.shape == "attribute":
        return "attribute" if entry.name in assigned_in_init(owner) else "missing"
    if not hasattr(owner, entry.name):
        return "missing"
    if not inspect.isclass(owner):
        value = getattr(owner, entry.name)
        return shape_of(value) if callable(value) else "constant"
    raw = inspect.getattr_static(owner, entry.name)
    if isinstance(raw, type):
        return "class"
    if isinstance(raw, (classmethod, staticmethod)):
        return shape_of(getattr(owner, entry.name))
    if not callable(raw) and not isinstance(raw, (property, cached_property)):
        return "constant"
    if isinstance(raw, property):
        return "property"
    if isinstance(raw, cached_property):
        return "cached_property"
    return shape_of(getattr(owner, entry.name))
