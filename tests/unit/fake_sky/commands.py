"""The programs a fake sandbox can run, each on its in-memory tree (``tree.py``).

Each takes the options listed in its docstring and refuses any other (`CannotAnswer`), so a
command the product starts to issue differently fails loudly instead of being half-answered.
Messages and exit codes are those of Debian's coreutils and dash for the same mistakes.
"""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import re

from .errors import CannotAnswer
from .interpreter import Builtin, Process, ShellExit, run_script
from .tree import Dir, File, Link, TreeError

__all__ = ["BUILTINS"]


def _refuse(program: str, args: list[str]) -> CannotAnswer:
    return CannotAnswer(f"the fake SDK's {program} does not take {' '.join(args)!r}")


def _flags(program: str, args: list[str], allowed: str) -> tuple[set[str], list[str]]:
    """Leading single-letter flags (``-rf``) out of ``allowed``, and the operands after them."""
    flags: set[str] = set()
    while args and args[0].startswith("-") and args[0] not in ("-", "--"):
        letters = set(args[0][1:])
        if not letters <= set(allowed):
            raise _refuse(program, args)
        flags |= letters
        args = args[1:]
    return flags, args[1:] if args[:1] == ["--"] else args


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


async def cat(proc: Process, args: list[str]) -> int:
    """``cat FILES``; no files: its stdin (an exec has none; ``< FILE`` gives one)."""
    if not args:
        proc.out += proc.stdin
        return 0
    code = 0
    for name in args:
        try:
            proc.out += proc.tree.read(proc.path(name))
        except TreeError as exc:
            proc.complain(f"cat: {name}: {exc.message}\n")
            code = 1
    return code


async def mkdir(proc: Process, args: list[str]) -> int:
    """``mkdir [-p] [-m OCTAL] DIRS``."""
    mode = 0o755
    if "-m" in args:
        at = args.index("-m")
        mode, args = int(args[at + 1], 8), args[:at] + args[at + 2 :]
    flags, names = _flags("mkdir", args, "p")
    code = 0
    for name in names:
        try:
            proc.tree.mkdir(proc.path(name), parents="p" in flags, mode=mode)
        except TreeError as exc:
            proc.complain(f"mkdir: cannot create directory '{name}': {exc.message}\n")
            code = 1
    return code


async def rm(proc: Process, args: list[str]) -> int:
    """``rm [-f] [-r|-R] PATHS``."""
    flags, names = _flags("rm", args, "frR")
    code = 0
    for name in names:
        try:
            proc.tree.remove(proc.path(name), recursive=bool(flags & {"r", "R"}))
        except TreeError as exc:
            if exc.reason == "ENOENT" and "f" in flags:
                continue
            proc.complain(f"rm: cannot remove '{name}': {exc.message}\n")
            code = 1
    return code


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


async def chmod(proc: Process, args: list[str]) -> int:
    """``chmod [-R] OCTAL|+x PATHS``."""
    flags, rest = _flags("chmod", args, "R")
    mode_text, names = rest[0], rest[1:]
    if not re.fullmatch(r"[0-7]{3,4}|\+x", mode_text):
        raise _refuse("chmod", args)
    code = 0
    for name in names:
        targets = [proc.path(name)]
        if "R" in flags and isinstance(proc.tree.get(targets[0]), Dir):
            root = proc.tree.resolve(targets[0])
            targets += [p for p in proc.tree.nodes if p.startswith(root.rstrip("/") + "/")]
        for target in targets:
            node = proc.tree.get(target)
            if node is None:
                proc.complain(f"chmod: cannot access '{name}': No such file or directory\n")
                code = 1
                continue
            node.mode = node.mode | 0o111 if mode_text == "+x" else int(mode_text, 8)
    return code


async def tar(proc: Process, args: list[str]) -> int:
    """``tar -c|-x [-z] -f ARCHIVE [-C DIR] [MEMBERS]`` (options bundled or apart)."""
    opts, operands, directory, archive = set(), [], proc.cwd, None
    items = list(args)
    while items:
        item = items.pop(0)
        if item == "-C":
            directory = proc.path(items.pop(0))
        elif re.fullmatch(r"-?[cxzvf]+", item) and not operands:
            opts |= set(item.lstrip("-"))
            if "f" in item:
                archive = items.pop(0)
        else:
            operands.append(item)
    if len(opts & {"c", "x"}) != 1 or archive in (None, "-") or ("x" in opts and operands):
        raise _refuse("tar", args)
    assert archive is not None
    try:
        if "x" in opts:
            proc.tree.unpack(proc.tree.read(proc.path(archive)), directory)
        else:
            roots = [(posixpath.normpath(posixpath.join(directory, member)), member) for member in operands]
            proc.tree.write(proc.path(archive), proc.tree.pack(roots, gzip="z" in opts))
    except TreeError as exc:
        proc.complain(f"tar: {exc}\n")
        return 2
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


async def sha256sum(proc: Process, args: list[str]) -> int:
    """``sha256sum FILES``."""
    code = 0
    for name in args:
        try:
            proc.say(f"{hashlib.sha256(proc.tree.read(proc.path(name))).hexdigest()}  {name}\n")
        except TreeError as exc:
            proc.complain(f"sha256sum: {name}: {exc.message}\n")
            code = 1
    return code


async def wc(proc: Process, args: list[str]) -> int:
    """``wc -c [FILE]`` (no file: its stdin)."""
    if args[:1] != ["-c"] or len(args) > 2:
        raise _refuse("wc", args)
    if len(args) == 1:
        proc.say(f"{len(proc.stdin)}\n")
        return 0
    try:
        proc.say(f"{len(proc.tree.read(proc.path(args[1])))} {args[1]}\n")
    except TreeError as exc:
        proc.complain(f"wc: {args[1]}: {exc.message}\n")
        return 1
    return 0


async def stat(proc: Process, args: list[str]) -> int:
    """``stat [-L] -c FORMAT [--] PATHS`` with ``%s %a %U %n`` (every file is root's)."""
    follow = "-L" in args
    rest = [a for a in args if a not in ("-L", "--")]
    if rest[:1] != ["-c"] or len(rest) < 3 or re.sub(r"%[saUn]", "", rest[1]).count("%"):
        raise _refuse("stat", args)
    code = 0
    for name in rest[2:]:
        node = proc.tree.get(proc.path(name), follow=follow)
        if node is None:
            proc.complain(f"stat: cannot statx '{name}': No such file or directory\n")
            code = 1
            continue
        size = len(node.data) if isinstance(node, File) else len(node.target) if isinstance(node, Link) else 4096
        fields = {"%s": str(size), "%a": f"{node.mode & 0o7777:o}", "%U": "root", "%n": name}
        proc.say(re.sub(r"%[saUn]", lambda m, said=fields: said[m.group()], rest[1]) + "\n")
    return code


async def ln(proc: Process, args: list[str]) -> int:
    """``ln -s TARGET LINK``."""
    if len(args) != 3 or args[0] != "-s":
        raise _refuse("ln", args)
    try:
        proc.tree.symlink(args[1], proc.path(args[2]))
    except TreeError as exc:
        proc.complain(f"ln: failed to create symbolic link '{args[2]}': {exc.message}\n")
        return 1
    return 0


async def find(proc: Process, args: list[str]) -> int:
    """``find PATH [-type d|f|l] [-empty]``: every match, the path first, then sorted."""
    if not args:
        raise _refuse("find", args)
    start, rest = args[0], args[1:]
    kind, empty = None, False
    while rest:
        if rest[:1] == ["-empty"]:
            empty, rest = True, rest[1:]
        elif rest[:1] == ["-type"] and len(rest) > 1 and rest[1] in ("d", "f", "l"):
            kind, rest = {"d": Dir, "f": File, "l": Link}[rest[1]], rest[2:]
        else:
            raise _refuse("find", args)
    root = proc.tree.resolve(proc.path(start))
    if proc.tree.nodes.get(root) is None:
        proc.complain(f"find: '{start}': No such file or directory\n")
        return 1
    for real in [root, *sorted(p for p in proc.tree.nodes if p.startswith(root.rstrip("/") + "/"))]:
        node = proc.tree.nodes[real]
        if kind is not None and not isinstance(node, kind):
            continue
        if empty and not (
            isinstance(node, File) and not node.data or isinstance(node, Dir) and not proc.tree.children(real)
        ):
            continue
        proc.say(start.rstrip("/") + real[len(root) :] + "\n" if real != root else start + "\n")
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
