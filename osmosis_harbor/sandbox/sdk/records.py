"""Reading an ``ls()`` record, whatever its SDK's shape.

SkyPilot's ``ls()`` returns sandbox handles (terminable, as its own pool clean-up shows) whose
raw record is ``_record``, a mapping in which the pool a sandbox came from is ``template_name``;
the Docker SDK returns plain records with attributes; a test double may return mappings. Every
reader of a record goes through these accessors, so one SDK's shape is read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["field_of", "name_of", "pool_of", "status_of"]


def field_of(record: Any, name: str, *aliases: str) -> Any:
    """``name`` (or the first alias present) as an attribute, a mapping key, or a key of the
    record's raw ``_record`` mapping; None when none of them has it."""
    raw = getattr(record, "_record", None)
    for key in (name, *aliases):
        if isinstance(record, Mapping):
            if record.get(key) is not None:
                return record[key]
        else:
            value = getattr(record, key, None)
            if value is not None and not callable(value):
                return value
        if isinstance(raw, Mapping) and raw.get(key) is not None:
            return raw[key]
    return None


def name_of(record: Any) -> str | None:
    value = field_of(record, "name")
    return str(value) if value is not None else None


def status_of(record: Any) -> str | None:
    value = field_of(record, "status")
    return None if value is None else str(getattr(value, "value", value))


def pool_of(record: Any) -> str | None:
    """The pool a sandbox was claimed from (SkyPilot's ``template_name``), if any."""
    value = field_of(record, "pool", "template_name")
    return str(value) if value else None
