"""The rule selection behind ``harbor lint`` (its defaults, a dataset's manifest, a task's
``task.toml``): private to Harbor's CLI module, so it is reached here, the one place Harbor's
private names live. Re-deriving it would drift from Harbor's; ``surface_elsewhere.py`` checks it
still exists with the shape we call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["selected_rules"]


def selected_rules(task_dir: Path, config: Any) -> Any:
    """The rules ``harbor lint TASK_DIR`` would run on ``task_dir`` with ``config`` (a ``LintConfig``)."""
    from harbor.cli.lint import _selected_rules  # imported late: Harbor's CLI pulls in typer

    return _selected_rules(task_dir, config)
