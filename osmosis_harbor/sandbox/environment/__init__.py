"""The Harbor environment for our sandboxes, and the collaborators it is built from.

``osmosis_harbor.sandbox.environment:SandboxEnvironment`` is the import path Harbor configs
name (``harbor run --environment-import-path``), so the class is found here; it is imported on
first use, so that a collaborator's import does not pull in Harbor's whole environment stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment

__all__ = ["SandboxEnvironment"]


def __getattr__(name: str) -> Any:
    if name == "SandboxEnvironment":
        from osmosis_harbor.sandbox.environment.sandbox_environment import SandboxEnvironment

        return SandboxEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
