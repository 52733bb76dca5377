"""Running an exec's argv in a fake sandbox: the argv as given (no implicit shell), a script
through the fake's shell (``shell.py``), each command from the explicit table (``commands.py``).

Everything runs as root in the fake (it has no users); a program the fake does not know is
refused (`CannotAnswer`), except a path that is not in the sandbox's tree (exit 127, as sh) and
an executable ``#!/bin/sh`` or ``#!/bin/bash`` script in the tree, which runs through the shell.
"""

from __future__ import annotations

import posixpath
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from .errors import CannotAnswer
from .shell import Command, Part, Word, expand, parse
from .tree import Dir, File, Tree, TreeError

__all__ = ["Builtin", "Process", "ShellExit", "run_argv", "run_script"]

Builtin = Callable[["Process", list[str]], Awaitable[int]]
SHEBANGS = ("#!/bin/sh", "#!/bin/bash", "#!/usr/bin/env sh", "#!/usr/bin/env bash")
KERNEL_TREES = frozenset({"proc", "sys", "dev"})
SYSTEM_DIRS = ("/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin")


class ShellExit(Exception):
    """``exit N``: ends the script that runs it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class Process:
    """One command's world: the sandbox's tree, its environment, directory and output."""

    tree: Tree
    env: dict[str, str]
    cwd: str
    builtins: dict[str, Builtin]
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    shell_vars: dict[str, str] = field(default_factory=dict)
    status: int = 0
    stdin: bytes = b""  # an exec has none; ``< FILE`` gives one

    def child(self, env: dict[str, str] | None = None) -> Process:
        return Process(self.tree, dict(self.env if env is None else env), self.cwd, self.builtins)

    def say(self, text: str) -> None:
        self.out += text.encode()

    def complain(self, text: str) -> None:
        self.err += text.encode()

    def path(self, name: str) -> str:
        """``name`` made absolute; the kernel's trees are refused (the fake has no kernel)."""
        path = Tree.absolute(name, self.cwd)
        if path.split("/")[1] in KERNEL_TREES:
            raise CannotAnswer(f"the fake SDK has no kernel: it cannot answer for {path!r}")
        return path


async def run_argv(proc: Process, argv: Sequence[str]) -> int:
    """Run ``argv[0]`` with its arguments: a builtin, or a script file in the tree."""
    name, args = argv[0], list(argv[1:])
    if "/" in name and posixpath.dirname(name) in SYSTEM_DIRS and posixpath.basename(name) in proc.builtins:
        name = posixpath.basename(name)
    if "/" not in name:
        builtin = proc.builtins.get(name)
        if builtin is None:
            raise CannotAnswer(
                f"the fake SDK cannot run {name!r}: it runs only {', '.join(sorted(proc.builtins))} "
                "and #!/bin/sh scripts in its tree"
            )
        return await builtin(proc, args)
    node = proc.tree.get(proc.path(name))
    if node is None:
        proc.complain(f"sh: 1: {name}: not found\n")
        return 127
    if isinstance(node, Dir) or not isinstance(node, File) or not node.mode & 0o111:
        proc.complain(f"sh: 1: {name}: Permission denied\n")
        return 126
    first = node.data.split(b"\n", 1)[0].decode(errors="replace").strip()
    if first not in SHEBANGS:
        raise CannotAnswer(f"the fake SDK cannot run {name!r}: not a #!/bin/sh script (first line {first[:60]!r})")
    return await run_script(proc, node.data.decode(errors="replace"))


async def run_script(proc: Process, script: str) -> int:
    """Run a shell script in ``proc`` (its ``exit`` ends it); returns its exit code."""
    items = parse(script)  # refuses what the fake's shell cannot run, before anything runs
    status = 0
    try:
        for connector, command in items:
            if connector == "&&" and status != 0 or connector == "||" and status == 0:
                continue
            status = await _run_command(proc, command, status)
    except ShellExit as done:
        return done.code
    return status


def _assignment(word: Word) -> tuple[str, Word] | None:
    """``NAME=value``: the name from the word's leading unquoted text, the rest its value."""
    name = ""
    for index, part in enumerate(word.parts):
        if part.quoted or part.var:
            return None
        if "=" in part.text:
            before, _, after = part.text.partition("=")
            name += before
            if not name.isidentifier():
                return None
            return name, Word([Part(after, False), *word.parts[index + 1 :]])
        name += part.text
    return None


async def _run_command(proc: Process, command: Command, last: int) -> int:
    variables = {**proc.env, **proc.shell_vars, "?": str(last)}
    words = list(command.words)
    assigned: dict[str, str] = {}
    while words and (pair := _assignment(words[0])) is not None:
        assigned[pair[0]] = "".join(expand(pair[1], variables)) or ""
        words.pop(0)
    argv = [item for word in words for item in expand(word, variables)]
    if not argv:
        proc.shell_vars.update(assigned)
        return 0
    child = proc.child({**proc.env, **assigned})
    child.stdin = _stdin(proc, command, variables)
    child.shell_vars, child.status = proc.shell_vars, last
    before = dict(child.env)
    try:
        code = await run_argv(child, argv)
    finally:
        proc.cwd = child.cwd  # cd is a shell builtin: it changes the shell's directory
        proc.env.update({k: v for k, v in child.env.items() if before.get(k) != v})  # export
        _route(proc, child, command, variables)
    return code


def _stdin(proc: Process, command: Command, variables: dict[str, str]) -> bytes:
    data = proc.stdin
    for redirect in command.redirects:
        if redirect.op == "<" and isinstance(redirect.target, Word):
            target = "".join(expand(redirect.target, variables))
            if target == "/dev/null":
                data = b""
                continue
            try:
                data = proc.tree.read(proc.path(target))
            except TreeError as exc:
                proc.complain(f"sh: 1: cannot open {target}: {exc.message}\n")
                raise ShellExit(2) from None
    return data


def _route(proc: Process, child: Process, command: Command, variables: dict[str, str]) -> None:
    """Send the command's stdout and stderr where its redirections say, left to right."""
    where: dict[int, tuple[str, str]] = {1: ("stream", "out"), 2: ("stream", "err")}
    for redirect in command.redirects:
        if redirect.op == "<":
            continue
        if isinstance(redirect.target, int):
            where[redirect.fd] = where[redirect.target]
            continue
        target = "".join(expand(redirect.target, variables))
        if target == "/dev/null":
            where[redirect.fd] = ("null", "")
            continue
        path = proc.path(target)
        try:
            if redirect.op == ">":
                proc.tree.write(path, b"")
        except TreeError as exc:
            proc.complain(f"sh: 1: cannot create {target}: {exc.message}\n")
            raise ShellExit(2) from None
        where[redirect.fd] = ("file", path)
    for fd, data in ((1, child.out), (2, child.err)):
        kind, target = where[fd]
        if kind == "stream":
            (proc.out if target == "out" else proc.err).extend(data)
        elif kind == "file" and data:
            proc.tree.write(target, bytes(data), append=True)
