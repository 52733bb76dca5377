"""The programs a fake sandbox can run, each on its in-memory tree (``tree.py``).

The shell's own and the text programs are here, those of files in ``file_commands.py``. Each
takes the options listed in its docstring and refuses any other (`CannotAnswer`), so a command
the product starts to issue differently fails loudly instead of being half-answered. Messages
and exit codes are those of Debian's coreutils and dash for the same mistakes.
"""

from __future__ import annotations

import asyncio
import re

from .file_commands import cat, chmod, find, ln, mkdir, rm, sha256sum, stat, tar, wc
from .interpreter import Builtin, Process, ShellExit, run_script
from .refusals import refuse as _refuse
from .tree import Dir, File, Link, TreeError

__all__ = ["BUILTINS"]


async def true(proc: Process, args: list[str]) -> int:
    """``true``, ``:``: exit 0."""
    return 0


async def false(proc: Process, args: list[str]) -> int:
    """``false``: exit 1."""
    return 1


async def exit_(proc: Process, args: list[str]) -> int:
    """``exit [N]``."""
    raise ShellExit(int(args[0]) & 0xFF if args else proc.status)


async def echo(proc: Process, args: list[str]) -> int:
    """``echo [-n] WORDS``; a backslash is refused (dash and bash read it differently)."""
    newline = not (args[:1] == ["-n"])
    words = args[1:] if not newline else args
    if any("\\" in word for word in words):
        raise _refuse("echo", args)
    proc.say(" ".join(words) + ("\n" if newline else ""))
    return 0


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "0": "\0"}


async def printf(proc: Process, args: list[str]) -> int:
    """``printf FORMAT ARGS``: ``%s``, ``%d``, ``%%`` and ``\\n \\t \\r \\\\``; the format is
    reused while arguments remain, as POSIX says."""
    if not args:
        raise _refuse("printf", args)
    fmt, rest = args[0], list(args[1:])
    pieces = re.findall(r"%%|%[sd]|%.|\\.|[^%\\]+|\\$", fmt)
    while True:
        for piece in pieces:
            if piece == "%%":
                proc.say("%")
            elif piece in ("%s", "%d"):
                value = rest.pop(0) if rest else ""
                proc.say(str(int(value or 0)) if piece == "%d" else value)
            elif piece.startswith("%"):
                raise _refuse("printf", [fmt])
            elif piece.startswith("\\"):
                if piece[1:] not in _ESCAPES:
                    raise _refuse("printf", [fmt])
                proc.say(_ESCAPES[piece[1:]])
            else:
                proc.say(piece)
        if not rest or not any(p in ("%s", "%d") for p in pieces):
            return 0


def _test(proc: Process, args: list[str]) -> bool:
    if args[:1] == ["!"]:
        return not _test(proc, args[1:])
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2:
        op, operand = args
        if op in ("-n", "-z"):
            return (operand != "") == (op == "-n")
        node = proc.tree.get(proc.path(operand), follow=op not in ("-L", "-h"))
        kinds = {"-e": object, "-f": File, "-d": Dir, "-L": Link, "-h": Link, "-s": File, "-x": object}
        if op not in kinds:
            raise _refuse("test", args)
        if node is None or not isinstance(node, kinds[op]):
            return False
        return bool(node.data) if op == "-s" else (bool(node.mode & 0o111) if op == "-x" else True)
    if len(args) == 3 and args[1] in ("=", "!="):
        return (args[0] == args[2]) == (args[1] == "=")
    numeric = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-gt": int.__gt__}
    if len(args) == 3 and args[1] in numeric:
        return bool(numeric[args[1]](int(args[0]), int(args[2])))
    raise _refuse("test", args)


async def test(proc: Process, args: list[str]) -> int:
    """``test`` / ``[ ... ]``: ``-e -f -d -L -h -s -x -n -z``, ``= !=``, ``-eq -ne -lt -gt``, ``!``."""
    return 0 if _test(proc, args) else 1


async def bracket(proc: Process, args: list[str]) -> int:
    if args[-1:] != ["]"]:
        proc.complain("[: missing ]\n")
        return 2
    return await test(proc, args[:-1])


async def pwd(proc: Process, args: list[str]) -> int:
    """``pwd``."""
    proc.say(proc.cwd + "\n")
    return 0


async def cd(proc: Process, args: list[str]) -> int:
    """``cd DIR``."""
    target = proc.path(args[0]) if args else "/root"
    if not isinstance(proc.tree.get(target), Dir):
        proc.complain(f"sh: 1: cd: can't cd to {args[0] if args else '~'}\n")
        return 2
    proc.cwd = target
    return 0


async def sleep(proc: Process, args: list[str]) -> int:
    """``sleep SECONDS`` (the event loop's sleep: a timeout or a termination cancels it)."""
    if len(args) != 1:
        raise _refuse("sleep", args)
    await asyncio.sleep(float(args[0].removesuffix("s")))
    return 0


async def id_(proc: Process, args: list[str]) -> int:
    """``id [-u|-g|-un]``, ``whoami``: the fake runs every command as root."""
    answers = {(): "uid=0(root) gid=0(root) groups=0(root)", ("-u",): "0", ("-g",): "0", ("-un",): "root"}
    if tuple(args) not in answers:
        raise _refuse("id", args)
    proc.say(answers[tuple(args)] + "\n")
    return 0


async def whoami(proc: Process, args: list[str]) -> int:
    return await id_(proc, ["-un"])


async def sh(proc: Process, args: list[str]) -> int:
    """``sh -c SCRIPT [NAME ARGS]``, ``bash -c ...``, ``sh FILE``: the fake's shell (``shell.py``)."""
    if args[:1] == ["-c"] and len(args) >= 2:
        return await run_script(proc, args[1])
    if len(args) == 1 and not args[0].startswith("-"):
        try:
            return await run_script(proc, proc.tree.read(proc.path(args[0])).decode(errors="replace"))
        except TreeError as exc:
            proc.complain(f"sh: 0: cannot open {args[0]}: {exc.message}\n")
            return 2
    raise _refuse("sh", args)


async def export(proc: Process, args: list[str]) -> int:
    """``export NAME=VALUE``."""
    for item in args:
        name, sep, value = item.partition("=")
        if not name.isidentifier():
            raise _refuse("export", args)
        proc.env[name] = value if sep else proc.shell_vars.get(name, proc.env.get(name, ""))
    return 0


BUILTINS: dict[str, Builtin] = {
    "true": true,
    ":": true,
    "false": false,
    "exit": exit_,
    "echo": echo,
    "printf": printf,
    "cat": cat,
    "mkdir": mkdir,
    "rm": rm,
    "test": test,
    "[": bracket,
    "pwd": pwd,
    "cd": cd,
    "sleep": sleep,
    "chmod": chmod,
    "tar": tar,
    "id": id_,
    "whoami": whoami,
    "sh": sh,
    "bash": sh,
    "export": export,
    "sha256sum": sha256sum,
    "ln": ln,
    "wc": wc,
    "stat": stat,
    "find": find,
}
