"""``task.toml``, read in one place: Harbor's ``TaskConfig`` of a task directory.

Harbor's model is the authority on the format (defaults, legacy keys, steps); every reader of a
task here asks ``task_config`` rather than re-parsing, and gets the same one-line errors naming
the file. A parse costs milliseconds and every rollout of a task reads the same text several
times (plan, copy, verification, validation), so a parse is kept per distinct text: the model
handed out is shared, never to be changed (``model_copy(deep=True)`` first to change one).
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from osmosis_harbor.errors import DatasetError

if TYPE_CHECKING:
    from harbor.models.task.config import TaskConfig

__all__ = ["TASK_CONFIG", "parse_task_config", "task_config"]

TASK_CONFIG = "task.toml"


def task_config(task_dir: Path) -> TaskConfig:
    """The ``TaskConfig`` of ``task_dir/task.toml`` (shared: do not change it).

    Raises ``DatasetError`` naming the file for text that is not UTF-8, malformed TOML or an
    invalid field; ``OSError`` when the file cannot be read."""
    path = Path(task_dir) / TASK_CONFIG
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text: {exc}") from None
    return parse_task_config(text, path)


def parse_task_config(text: str, where: Path | str = TASK_CONFIG) -> TaskConfig:
    """The ``TaskConfig`` of a ``task.toml`` text (shared); errors name ``where``."""
    try:
        return _parsed(text)
    except tomllib.TOMLDecodeError as exc:
        raise DatasetError(f"{where}: malformed TOML: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise DatasetError(f"{where}: invalid field {field}: {first['msg']}") from None


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> TaskConfig:
    from harbor.models.task.config import TaskConfig  # Harbor's models load in a few hundred ms

    return TaskConfig.model_validate_toml(text)
