"""The one exception type the bundler raises for user errors."""

from __future__ import annotations

__all__ = ["BundleError"]


class BundleError(ValueError):
    """A bundle cannot be built or read.

    Every message names the offending thing (a path, an import path, a table of
    ``pyproject.toml``) and says how to fix it.
    """
