"""The fake's programs of files: each on the sandbox's in-memory tree (``tree.py``), with the
options its docstring lists and no other (``commands.py`` says why)."""

from __future__ import annotations

import hashlib
import posixpath
import re

from .interpreter import Process
from .refusals import flags as _flags
from .refusals import refuse as _refuse
from .tree import Dir, File, Link, TreeError

__all__ = ["cat", "chmod", "find", "ln", "mkdir", "rm", "sha256sum", "stat", "tar", "wc"]


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
