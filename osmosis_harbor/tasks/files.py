"""Writing our own files into a task copy."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_file"]


def write_file(path: Path, data: str, mode: int | None = None) -> None:
    """Write a file of ours, replacing (never writing through) a symlink at that name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(data, encoding="utf-8")
    if mode is not None:
        path.chmod(mode)
