"""The installed Harbor line and what it changes for us, decided once.

osmosis-harbor supports Harbor 0.25 and 0.26 (``pyproject.toml``). Every module that behaves
differently on the two reads `HARBOR` (a fact about the line, named for what it changes), never
the version string, so supporting a third line is one entry in `LINES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version

__all__ = ["HARBOR", "LINES", "HarborLine", "harbor_version", "line_of"]


@dataclass(frozen=True)
class HarborLine:
    """What one Harbor line does that we depend on.

    ``options_model``: environments declare a pydantic ``options_model``; ``BaseEnvironment``
    reads ``self.options`` in its ``__init__`` and ``preflight(cls, kwargs)`` validates the
    user's kwargs through ``parse_options``. ``error_policies``: failures map to
    ``ErrorPolicy(should_retry, should_grade, has_valid_reward)`` by exception type name
    (``TrialConfig.override_error_policy`` per trial), and the agent phase records *any*
    exception and grades after it unless its policy says not to (0.25 recorded only
    Harbor's agent timeout and non-zero exit; anything else ended the trial ungraded).
    ``tar_pack_tolerant``: a sandbox-side pack that exits 1 with only GNU tar's "file changed
    as we read it" counts as packed."""

    name: str
    options_model: bool
    error_policies: bool
    tar_pack_tolerant: bool


LINES: dict[str, HarborLine] = {
    "0.25": HarborLine("0.25", options_model=False, error_policies=False, tar_pack_tolerant=False),
    "0.26": HarborLine("0.26", options_model=True, error_policies=True, tar_pack_tolerant=True),
}


def harbor_version() -> str:
    return version("harbor")


def line_of(release: str) -> HarborLine:
    """The supported line a Harbor release belongs to (``0.26.0``, ``0.25.1.dev2026...``)."""
    key = ".".join(release.split(".")[:2])
    try:
        return LINES[key]
    except KeyError:
        raise ImportError(
            f"osmosis-harbor supports harbor {' and '.join(LINES)} (harbor>=0.25,<0.27); harbor {release} is installed"
        ) from None


HARBOR: HarborLine = line_of(harbor_version())
