"""Every Harbor name we depend on beyond a plain call of its documented API, in one place.

Our environment implements Harbor's ``BaseEnvironment`` (``sandbox/environment/``): it calls
its ``__init__``, overrides its abstract and transfer methods and calls a few of its private
helpers; of Harbor's ``SkypilotEnvironment`` it keeps the behaviour (create keywords, exec argv,
image commands, pool upload) as copies, listed too, so that a change there says a copy may be
stale; Harbor's private constants are re-exported by ``skypilot_names.py``. Elsewhere we call a private helper of Harbor's lint
CLI, copy a command its verifier builds, and subclass its agent base. Each such name is listed
here: the Harbor object, the name, the shape we rely on (parameter names and kinds, or what kind
of attribute it is), how we use it and why. ``tests/unit/harbor_compat/test_surface.py`` checks each against
the installed Harbor, and checks that the list is complete, so a Harbor release that renames or
reshapes one fails there, by name, instead of inside a trial. An entry holds on the Harbor
lines it names (``lines``, ``version.py``): where 0.25 and 0.26 differ, each has its own entry,
and the test checks the installed line's (`surface_for`).
"""

from __future__ import annotations

from osmosis_harbor.harbor_compat.names import BASE, SKY, HarborName, Use
from osmosis_harbor.harbor_compat.surface_elsewhere import ELSEWHERE_NAMES
from osmosis_harbor.harbor_compat.surface_environment import ENVIRONMENT_NAMES
from osmosis_harbor.harbor_compat.version import HARBOR

__all__ = ["BASE", "SKY", "SURFACE", "HarborName", "Use", "surface_for"]

SURFACE: tuple[HarborName, ...] = ENVIRONMENT_NAMES + ELSEWHERE_NAMES


def surface_for(line: str = HARBOR.name) -> tuple[HarborName, ...]:
    """The entries that hold on Harbor ``line`` (the installed one by default)."""
    return tuple(entry for entry in SURFACE if line in entry.lines)
