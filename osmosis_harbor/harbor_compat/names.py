"""How a Harbor name we depend on is written down (``surface.py`` lists them): the Harbor object,
the name, the shape we rely on, how we use it, where and why, and the Harbor lines it holds on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from osmosis_harbor.harbor_compat.version import LINES

__all__ = [
    "BASE",
    "BOUNDS",
    "ENV",
    "EXEC_RECORDS",
    "GUARD",
    "IMAGES",
    "LIFECYCLE",
    "PREPARATION",
    "SKY",
    "V025",
    "V026",
    "C",
    "K",
    "OVR",
    "R",
    "S",
    "HarborName",
    "Use",
]


class Use(StrEnum):
    OVERRIDE = "override"  # we replace it, and Harbor's code calls ours
    CALL = "call"  # we call it (often through super()), or rely on Harbor calling it on our object
    READ = "read"  # a property, attribute or constant we read
    SET = "set"  # an attribute Harbor's methods read, set by us
    COPY = "copy"  # we carry a copy of its logic, or of a command it builds


@dataclass(frozen=True)
class HarborName:
    """``owner`` is ``module`` or ``module:Class``; ``shape`` is the canonical signature (names
    and kinds, no annotations or defaults: ``shapes.shape_of``) or ``property`` / ``cached_property`` /
    ``attribute`` (assigned in the owner's ``__init__``) / ``constant`` / ``class``; ``lines``: the
    Harbor lines it holds on (all by default)."""

    owner: str
    name: str
    shape: str
    uses: tuple[Use, ...]
    where: str
    why: str
    lines: tuple[str, ...] = tuple(LINES)

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.name}"


SKY = "harbor.environments.skypilot:SkypilotEnvironment"
BASE = "harbor.environments.base:BaseEnvironment"
ENV = "sandbox/environment/sandbox_environment.py"
IMAGES = "sandbox/environment/images.py"
LIFECYCLE = "sandbox/environment/own_sandbox.py"
BOUNDS = "sandbox/sdk/bounds.py"
PREPARATION = "sandbox/environment/preparation.py"
EXEC_RECORDS = "sandbox/environment/exec_records.py"
GUARD = "sandbox/environment/verifier_guard.py"
OVR, C, R, S, K = Use.OVERRIDE, Use.CALL, Use.READ, Use.SET, Use.COPY


V025, V026 = ("0.25",), ("0.26",)
