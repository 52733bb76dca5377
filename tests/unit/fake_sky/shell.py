"""The fake's shell syntax: what ``sh -c SCRIPT`` may contain, parsed, and words expanded.

A small, explicit subset of POSIX sh, the part the product's and Harbor's scripts use: simple
commands joined by ``;``, newlines, ``&&`` and ``||``; single and double quotes and backslash
escapes; ``$NAME``, ``${NAME}``, ``${NAME-word}``, ``${NAME:-word}`` and ``$?``; field splitting
of unquoted expansions; ``NAME=value`` prefixes; redirections ``<``, ``>``, ``>>``, ``2>``,
``>&2``, ``2>&1``. Everything else (pipes, background jobs, subshells, command substitution, globbing,
``~``, here-documents, ``if``/``for``/``case``, positional parameters) raises `CannotAnswer`
with what was met: the fake refuses what it cannot run rather than run it wrongly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import CannotAnswer

__all__ = ["RESERVED", "Command", "Part", "Redirect", "Word", "expand", "parse"]

RESERVED = frozenset(
    "if then else elif fi for while until do done case esac function { } [[ ]] ! time select coproc".split()
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARAM = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<word>[^$`]*))?")


def refuse(what: str, script: str) -> CannotAnswer:
    return CannotAnswer(f"the fake SDK's shell does not run {what} (in {script[:200]!r})")


@dataclass(frozen=True)
class Part:
    """A piece of a word: literal text, or a parameter expression (``var``); quoted parts are
    not split into fields."""

    text: str
    quoted: bool
    var: bool = False


@dataclass
class Word:
    parts: list[Part] = field(default_factory=list)

    def literal(self) -> str | None:
        """The word's text when it holds no expansion (None otherwise)."""
        return None if any(p.var for p in self.parts) else "".join(p.text for p in self.parts)

    def unquoted_literal(self) -> str | None:
        return self.literal() if all(not p.quoted and not p.var for p in self.parts) else None


@dataclass(frozen=True)
class Redirect:
    """``fd`` sent to a file (``op`` ``>`` or ``>>``, ``target`` a word), to a descriptor
    (``op`` ``>&``, ``target`` an int), or read from a file (``fd`` 0, ``op`` ``<``)."""

    fd: int
    op: str
    target: Word | int


@dataclass
class Command:
    words: list[Word] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)


class _Parser:
    def __init__(self, script: str) -> None:
        self.s, self.i = script, 0
        self.items: list[tuple[str, Command]] = []
        self.connector = ";"
        self.command = Command()
        self.word: Word | None = None

    def peek(self, offset: int = 0) -> str:
        j = self.i + offset
        return self.s[j] if j < len(self.s) else ""

    def end_word(self) -> None:
        if self.word is not None:
            self._check_glob(self.word)
            self.command.words.append(self.word)
            self.word = None

    def _check_glob(self, word: Word) -> None:
        text = "".join(p.text for p in word.parts if not p.quoted and not p.var)
        if any(c in text for c in "*?") or ("[" in text and text not in ("[",)):
            raise refuse(f"globbing ({text!r})", self.s)
        if word.parts and not word.parts[0].quoted and not word.parts[0].var and word.parts[0].text.startswith("~"):
            raise refuse("tilde expansion", self.s)

    def end_command(self, next_connector: str) -> None:
        self.end_word()
        if self.command.words or self.command.redirects:
            first = self.command.words[0].unquoted_literal() if self.command.words else None
            if first in RESERVED:
                raise refuse(f"the compound command {first!r}", self.s)
            self.items.append((self.connector, self.command))
        elif next_connector in ("&&", "||"):
            raise refuse(f"an empty command before {next_connector!r}", self.s)
        self.command, self.connector = Command(), next_connector

    def add(self, text: str, *, quoted: bool, var: bool = False) -> None:
        if self.word is None:
            self.word = Word()
        self.word.parts.append(Part(text, quoted, var))

    def parameter(self, *, quoted: bool) -> None:
        """At ``$``: a parameter expression, or a literal ``$``."""
        nxt = self.peek(1)
        if nxt == "{":
            end = self.s.find("}", self.i + 2)
            body = self.s[self.i + 2 : end] if end >= 0 else ""
            if end < 0 or not _PARAM.fullmatch(body):
                raise refuse(f"the expansion ${{{body}", self.s)
            self.add(body, quoted=quoted, var=True)
            self.i = end + 1
        elif nxt == "?":
            self.add("?", quoted=quoted, var=True)
            self.i += 2
        elif (match := _NAME.match(self.s, self.i + 1)) is not None:
            self.add(match.group(), quoted=quoted, var=True)
            self.i = match.end()
        elif nxt == "(":
            raise refuse("command substitution $(...)", self.s)
        elif nxt and nxt in "0123456789#@*!$-":
            raise refuse(f"the special parameter ${nxt}", self.s)
        else:
            self.add("$", quoted=quoted)
            self.i += 1

    def double_quoted(self) -> None:
        self.i += 1
        self.add("", quoted=True)  # "" is a word even when empty
        while True:
            c = self.peek()
            if c == "":
                raise refuse("an unterminated double quote", self.s)
            if c == '"':
                self.i += 1
                return
            if c == "\\" and self.peek(1) in '$`"\\\n':
                if self.peek(1) != "\n":
                    self.add(self.peek(1), quoted=True)
                self.i += 2
            elif c == "$":
                self.parameter(quoted=True)
            elif c == "`":
                raise refuse("command substitution `...`", self.s)
            else:
                self.add(c, quoted=True)
                self.i += 1

    def redirect(self) -> None:
        """At ``>`` or ``<``: the word just read may be its descriptor (``2>``)."""
        fd = 0 if self.peek() == "<" else 1
        if fd and self.word is not None and self.word.unquoted_literal() in ("1", "2"):
            fd, self.word = int(self.word.unquoted_literal() or 1), None
        self.end_word()
        self.i += 1
        op = ">" if fd else "<"
        if not fd and self.peek() in "<(&>":
            raise refuse(f"the redirection <{self.peek()}", self.s)
        if fd and self.peek() == ">":
            op, self.i = ">>", self.i + 1
        if fd and self.peek() == "&":
            digits = self.peek(1)
            if digits not in ("1", "2"):
                raise refuse(f"the redirection >&{digits}", self.s)
            self.command.redirects.append(Redirect(fd, ">&", int(digits)))
            self.i += 2
            return
        while self.peek() in (" ", "\t"):
            self.i += 1
        start = len(self.command.words)
        self.read_one_word()
        if len(self.command.words) != start + 1:
            raise refuse("a redirection without a target", self.s)
        self.command.redirects.append(Redirect(fd, op, self.command.words.pop()))

    def read_one_word(self) -> None:
        while self.i < len(self.s) and self.peek() not in " \t\n;&|<>()":
            self.step()
        self.end_word()

    def step(self) -> None:
        c = self.peek()
        if c == "'":
            end = self.s.find("'", self.i + 1)
            if end < 0:
                raise refuse("an unterminated single quote", self.s)
            self.add(self.s[self.i + 1 : end], quoted=True)
            self.i = end + 1
        elif c == '"':
            self.double_quoted()
        elif c == "\\":
            if self.peek(1) != "\n":
                self.add(self.peek(1), quoted=True)
            self.i += 2
        elif c == "$":
            self.parameter(quoted=False)
        elif c == "`":
            raise refuse("command substitution `...`", self.s)
        else:
            self.add(c, quoted=False)
            self.i += 1

    def run(self) -> list[tuple[str, Command]]:
        while self.i < len(self.s):
            c, nxt = self.peek(), self.peek(1)
            if c in " \t":
                self.end_word()
                self.i += 1
            elif c == "#" and self.word is None:
                while self.peek() not in ("", "\n"):
                    self.i += 1
            elif c in "\n;":
                if c == ";" and nxt == ";":
                    raise refuse("';;'", self.s)
                self.end_command(";")
                self.i += 1
            elif c == "&" and nxt == "&" or c == "|" and nxt == "|":
                self.end_command(c + nxt)
                self.i += 2
            elif c == "&":
                raise refuse("a background job (&)" if nxt != ">" else "the redirection &>", self.s)
            elif c == "|":
                raise refuse("a pipeline (|)", self.s)
            elif c in "<>":
                self.redirect()
            elif c in "()":
                raise refuse(f"a subshell {c!r}", self.s)
            else:
                self.step()
        if self.connector in ("&&", "||") and not (self.command.words or self.word):
            raise refuse(f"a script ending in {self.connector!r}", self.s)
        self.end_command(";")
        return self.items


def parse(script: str) -> list[tuple[str, Command]]:
    """The script's simple commands, each with the connector before it (``;``, ``&&``, ``||``)."""
    return _Parser(script).run()


def _value(expression: str, variables: dict[str, str]) -> str:
    match = _PARAM.fullmatch(expression)
    if expression == "?" or match is None:
        return variables.get(expression, "")
    name, op, default = match.group("name"), match.group("op"), match.group("word") or ""
    value = variables.get(name)
    if op == "-" and value is None or op == ":-" and not value:
        return default
    return value or ""


def expand(word: Word, variables: dict[str, str]) -> list[str]:
    """The fields a word becomes: quoted text stays whole, unquoted expansions split on blanks."""
    fields: list[str] = []
    current: list[str] = []
    keep = False  # a quoted part makes a field even when empty
    for part in word.parts:
        text = _value(part.text, variables) if part.var else part.text
        if part.quoted or not part.var:
            current.append(text)
            keep = keep or part.quoted
            continue
        pieces = re.split(r"[ \t\n]+", text)
        for index, piece in enumerate(pieces):
            if index > 0 and (current or keep):
                fields.append("".join(current))
                current, keep = [], False
            if piece:
                current.append(piece)
    if current or keep:
        fields.append("".join(current))
    return fields
