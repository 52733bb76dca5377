"""Sandbox-made text as a terminal, a log, an XML file or a JSON file may show it.

A task id (a dataset's directory name), a step name, a file name or an output tail can hold
control characters: an ANSI escape that clears the screen or rewrites a line of the report, an
OSC sequence that sets the window title, a bidirectional override that shows ``ssap`` as
``pass``. ``printable`` spells each such character as its Python escape (``\\x1b``, ``\\u202e``)
so what is shown is what is there. Its output is also valid XML 1.0 text, which forbids most
control characters even as character references.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["json_safe", "printable"]

# C0 controls but tab and newline, DEL and the C1 controls (0x9b is a CSI on some terminals),
# bidirectional marks, embeddings, overrides and isolates, the line and paragraph separators,
# lone surrogates (undecodable bytes of a file name) and the two non-characters XML forbids.
_UNSHOWABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with every character in the module docstring's list spelled as an escape
    (newlines kept unless ``newlines`` is false; tabs kept)."""
    shown = _UNSHOWABLE.sub(_spelled, text)
    return shown if newlines else shown.replace("\n", "\\n")


def json_safe(value: Any) -> Any:
    """``value`` (JSON data: dicts, lists, strings, numbers) with lone surrogates spelled as
    escapes, which no UTF-8 JSON file can hold; every other character is left to the encoder."""
    if isinstance(value, str):
        return _SURROGATE.sub(_spelled, value)
    if isinstance(value, dict):
        return {json_safe(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    return value
