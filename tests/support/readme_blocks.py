"""The runnable blocks of README.md and docs/*.md, found by heading and language, so that a test
runs what a reader copies (``cli/test_readme.py`` checks every block has a runner; a block whose
flow another module already drives, such as the ``osmosis eval run`` walk-through, is run there)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.common import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
_BLOCK = re.compile(r"^(?P<heading>#{1,4} [^\n]*)$|^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    doc: str  # the file, relative to the repository
    section: str
    lang: str
    body: str

    def commands(self) -> list[str]:
        """Shell commands: comment lines dropped, continuations joined, trailing comments kept
        out (bash would ignore them anyway)."""
        joined = self.body.replace("\\\n", " ")
        return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def documents() -> list[Path]:
    """The files whose runnable blocks are checked: the README and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def readme_blocks() -> list[Block]:
    blocks = []
    for path in documents():
        doc, section = str(path.relative_to(REPO)), ""
        for match in _BLOCK.finditer(path.read_text()):
            if match["heading"]:
                section = match["heading"].lstrip("#").strip()
            elif match["lang"] in ("bash", "sh", "python"):
                blocks.append(Block(doc, section, match["lang"], match["body"]))
    return blocks


def block(section: str, lang: str, doc: str = "README.md") -> Block:
    found = [b for b in readme_blocks() if (b.doc, b.section, b.lang) == (doc, section, lang)]
    assert len(found) == 1, f"{doc}: expected one {lang} block under {section!r}, found {len(found)}"
    return found[0]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
