"""The one read-only command the audit runs in the sandbox, and the parsing of its output.

The command is POSIX ``sh`` over tools every Debian- or Ubuntu-based image has (``find``,
``sha256sum``, ``grep``, ``xargs``, ``head``, ``du``, ``wc``: coreutils, findutils and grep are
essential packages there); a tool the image lacks is reported, and the part that needed it is
reported as not done. It writes nothing, and every list it prints is cut by ``head`` at the
audit's bounds. Its output is hostile: each line is parsed by its marker, anything else is
ignored, paths are shown through ``shown``.

It prints, one marker per line:
``@pwd DIR``: the image's workdir; ``@missing TOOL``; ``@repo KIB ENTRIES PATH``: a ``.git``
directory (or a bare ``*.git`` one) with its size and entry count; ``@hash SHA256 PATH``: a
file whose size is one of the sizes looked for; ``@hit PATH:LINE``: a file containing a line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from pydantic import BaseModel

__all__ = ["Probe", "ProbeResult", "parse_probe"]

TOOLS = ("find", "sha256sum", "grep", "xargs", "head", "du", "wc", "sed", "cut", "tr")
# Not the agent's filesystem (kernel views), or not worth hashing.
_PRUNE_ALWAYS = ("/proc", "/sys", "/dev")
# Looked through for exact copies, not for contained lines: the system's own files, large and
# the same in every image built on the same base.
_PRUNE_FOR_LINES = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/boot",
    "/etc",
    "/var/lib",
    "/var/cache",
    "/var/log",
    "/snap",
)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _prune(paths: Iterable[str]) -> str:
    tests = " -o ".join(f"-path {shlex.quote(p)}" for p in paths)
    return f"\\( {tests} \\) -prune"


class Probe(BaseModel):
    """The bounds and targets of one probe."""

    sizes: list[int]  # file sizes whose files are hashed
    lines: list[str]  # fixed strings looked for
    max_repos: int
    max_hashed: int
    max_hits: int
    max_grep_files: int
    max_grep_file_kib: int
    timeout_sec: int
    max_output_bytes: int

    def command(self) -> str:
        t = self.timeout_sec
        parts = [
            "export LC_ALL=C",
            # `timeout` bounds each step inside the sandbox; the exec's own timeout is the backstop
            f'if timeout {t} true >/dev/null 2>&1; then T="timeout {t}"; else T=""; fi',
            'echo "@pwd $(pwd)"',
            f'for t in {" ".join(TOOLS)}; do command -v $t >/dev/null 2>&1 || echo "@missing $t"; done',
            # a grep without these options (an old BusyBox) would find nothing: say so instead
            "echo xyz | grep -IHoF -m 1 -e y >/dev/null 2>&1 || echo '@missing grep-options'",
            # repositories: .git directories anywhere, and bare *.git ones
            f"$T find / -xdev {_prune(_PRUNE_ALWAYS)} -o \\( -name .git -o -name '*.git' \\) -type d -print -prune"
            f" 2>/dev/null | head -n {self.max_repos + 1} | while IFS= read -r p; do"
            ' k=$(du -sk "$p" 2>/dev/null | cut -f1);'
            f' n=$($T find "$p" 2>/dev/null | head -n 1000000 | wc -l); echo "@repo ${{k:-0}} $n $p"; done',
        ]
        # Lists of paths are cut by `head -n` and handed on NUL-separated (`tr`, `xargs -0`: GNU
        # and BusyBox alike); a path holding a newline is split and found by neither tool.
        if self.sizes:
            sizes = " -o ".join(f"-size {s}c" for s in sorted(set(self.sizes)))
            parts.append(
                f"$T find / -xdev {_prune(_PRUNE_ALWAYS)} -o -type f \\( {sizes} \\) -print 2>/dev/null"
                f" | head -n {self.max_hashed + 1} | tr '\\n' '\\000' | xargs -0 -r sha256sum 2>/dev/null"
                " | sed 's/^/@hash /'"
            )
        if self.lines:
            patterns = " ".join(f"-e {shlex.quote(line)}" for line in self.lines)
            parts.append(
                f"$T find / -xdev {_prune(_PRUNE_ALWAYS + _PRUNE_FOR_LINES)} -o -type f"
                f" -size -{self.max_grep_file_kib}k -print 2>/dev/null | head -n {self.max_grep_files}"
                f" | tr '\\n' '\\000' | xargs -0 -r grep -IHoF -m 1 {patterns} 2>/dev/null"
                f" | head -n {self.max_hits + 1} | sed 's/^/@hit /'"
            )
        return "{ " + "; ".join(parts) + f"; }} 2>/dev/null | head -c {self.max_output_bytes}"


class ProbeResult(BaseModel):
    workdir: str | None = None
    missing: list[str] = []
    repos: list[tuple[int, int, str]] = []  # (KiB, entries, path)
    hashes: list[tuple[str, str]] = []  # (sha256, path)
    hits: list[tuple[str, str]] = []  # (path, line)
    truncated: list[str] = []  # which lists hit their bound


def parse_probe(output: str, probe: Probe) -> ProbeResult:
    result = ProbeResult()
    for line in output.split("\n"):
        marker, _, rest = line.partition(" ")
        if marker == "@pwd" and result.workdir is None and rest.startswith("/"):
            result.workdir = rest
        elif marker == "@missing" and (rest in TOOLS or rest == "grep-options"):
            result.missing.append(rest)
        elif marker == "@repo":
            kib, entries, path = (rest.split(" ", 2) + ["", ""])[:3]
            if kib.isdigit() and entries.isdigit() and path.startswith("/"):
                result.repos.append((int(kib), int(entries), path))
        elif marker == "@hash":
            digest, _, path = rest.partition("  ")
            if _HEX64.match(digest) and path.startswith("/"):
                result.hashes.append((digest, path))
        elif marker == "@hit":
            for pattern in probe.lines:  # the path may hold ':': the line is a known suffix
                if rest.endswith(":" + pattern) and rest.startswith("/"):
                    result.hits.append((rest[: -len(pattern) - 1], pattern))
                    break
    if len(result.repos) > probe.max_repos:
        result.repos = result.repos[: probe.max_repos]
        result.truncated.append(f"more than {probe.max_repos} repositories (audit_max_repos)")
    if len(result.hashes) > probe.max_hashed:
        result.hashes = result.hashes[: probe.max_hashed]
        result.truncated.append(f"more than {probe.max_hashed} files of a looked-for size (audit_max_hashed)")
    if len(result.hits) > probe.max_hits:
        result.hits = result.hits[: probe.max_hits]
        result.truncated.append(f"more than {probe.max_hits} files containing a line (audit_max_hashed)")
    if len(output.encode("utf-8", "replace")) >= probe.max_output_bytes:
        result.truncated.append(f"the probe's output reached {probe.max_output_bytes} bytes")
    return result
