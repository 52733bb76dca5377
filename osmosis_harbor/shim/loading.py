"""Resolve the bundle's ``"module:attr"`` targets into classes and configs.

The host bakes the import paths into the bundle's generated entry points.
Any failure to resolve them -- module missing, attribute missing, wrong kind
of object -- is reported as ``LoadError`` (a validation error): the bundle
does not describe a runnable workflow, which retrying will not fix. Dotted
attributes (``module:Outer.Inner``) are accepted because ``__qualname__``
produces them for nested classes.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

from osmosis_ai.rollout import AgentWorkflow, Grader

from .errors import LoadError


def load_object(path: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and return the object."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise LoadError(f"invalid import path {path!r}: expected 'module:attr'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module itself failing
        raise LoadError(f"cannot import module {module_name!r} for {path!r}: {type(exc).__name__}: {exc}") from exc
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            raise LoadError(f"{path!r}: {module_name} has no attribute {attr_path!r}") from exc
    return obj


def _load_subclass[T](path: str, base: type[T], role: str) -> type[T]:
    obj = load_object(path)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise LoadError(f"{role} {path!r} is {obj!r}, not a subclass of {base.__module__}.{base.__qualname__}")
    return obj


def load_workflow(path: str) -> type[AgentWorkflow[Any]]:
    return cast("type[AgentWorkflow[Any]]", _load_subclass(path, cast(type, AgentWorkflow), "workflow"))


def load_grader(path: str) -> type[Grader]:
    return cast("type[Grader]", _load_subclass(path, cast(type, Grader), "grader"))


def load_config(path: str | None) -> Any:
    """A module-level config object, or ``None`` when the bundle has none.

    Used as-is, like ``LocalBackend`` does: the workflow/grader receives the
    very object the user defined.
    """
    return load_object(path) if path else None
