"""How a fake program refuses what it does not take: a `CannotAnswer` naming it and its arguments."""

from __future__ import annotations

from .errors import CannotAnswer

__all__ = ["flags", "refuse"]


def refuse(program: str, args: list[str]) -> CannotAnswer:
    return CannotAnswer(f"the fake SDK's {program} does not take {' '.join(args)!r}")


def flags(program: str, args: list[str], allowed: str) -> tuple[set[str], list[str]]:
    """Leading single-letter flags (``-rf``) out of ``allowed``, and the operands after them."""
    flags: set[str] = set()
    while args and args[0].startswith("-") and args[0] not in ("-", "--"):
        letters = set(args[0][1:])
        if not letters <= set(allowed):
            raise refuse(program, args)
        flags |= letters
        args = args[1:]
    return flags, args[1:] if args[:1] == ["--"] else args
