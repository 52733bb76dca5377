"""The guard's check report: parsed strictly, and believed only when its HMAC verifies.

The report comes out of a sandbox where a root workflow ran, so it is hostile input until proven
otherwise: only the genuine guard, run from the daemon's sealed image, can read the daemon's key
and sign it, and the nonce makes every report single-use. A report that does not verify (the
daemon was killed and its pid reused, the guard's output forged or cut) is itself the finding:
the verifier's environment was tampered with. Text fields travel hex-encoded (names the agent
chose may hold any byte) and are decoded as the host's file-system encoding does.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Finding", "GuardReport", "KeptService", "KilledProcess", "ReportRejected", "parse_report", "shown"]

MAGIC = "osmosis-guard-report 1"
MAX_REPORT_BYTES = 4 * 1024 * 1024  # the guard prints at most ~1,000 records of each kind


class ReportRejected(ValueError):
    """A check's output the host will not believe; the message says why (for the tamper finding)."""


@dataclass(frozen=True)
class Finding:
    """One change to the verifier's toolchain: ``kind`` changed, removed or added (with the
    ``rule`` that makes an addition matter); ``digest`` is the sha256 of a file, a link's
    target, a directory's mode (``-`` when there is none)."""

    kind: Literal["changed", "removed", "added"]
    rule: str | None
    type: Literal["f", "d", "l", "o"]
    path: str
    digest: str

    def describe(self) -> str:
        what = {"changed": "changed", "removed": "removed", "added": f"added ({self.rule})"}[self.kind]
        return f"{shown(self.path)} {what}"


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    exe: str
    cmdline: str

    def describe(self) -> str:
        return f"process {self.pid} ({shown(self.cmdline or self.exe)[:120]})"


@dataclass(frozen=True)
class KeptService:
    pid: int
    port: int | None
    exe: str


@dataclass
class GuardReport:
    """What one check did and found, from a report whose HMAC verified."""

    killed: list[KilledProcess] = field(default_factory=list)
    kept: list[KeptService] = field(default_factory=list)
    listening: dict[int, int] = field(default_factory=dict)  # port -> pid, before anything was killed
    unkillable: list[int] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    cured: list[str] = field(default_factory=list)  # stale bytecode removed (Python recompiles it)
    set_aside: list[str] = field(default_factory=list)  # package caches renamed away
    truncated: dict[str, int] = field(default_factory=dict)
    logs: str = "ok"
    manifest: str = "ok"
    entries: int = 0


def shown(path: str) -> str:
    """A name the agent chose, fit for a log line or a message: control and undecodable bytes
    escaped, nothing else changed."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _text(hexed: str) -> str:
    if hexed == "-":
        return ""
    try:
        return os.fsdecode(bytes.fromhex(hexed))
    except ValueError:
        raise ReportRejected(f"a field is not hex: {hexed[:40]!r}") from None


def _int(text: str) -> int:
    if not text.isdigit() or len(text) > 12:
        raise ReportRejected(f"not a number: {text[:20]!r}")
    return int(text)


def _verify(raw: bytes, key: bytes) -> bytes:
    """The signed body, once its HMAC line verifies."""
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportRejected(f"the report is {len(raw)} bytes, over {MAX_REPORT_BYTES}")
    end = raw.rfind(b"end\nhmac ")
    if end < 0 or not raw.startswith(MAGIC.encode() + b"\n"):
        raise ReportRejected("no signed report (the guard daemon was killed, or the guard replaced)")
    body, tail = raw[: end + 4], raw[end + 4 :]
    claimed = tail.removeprefix(b"hmac ").strip()
    expected = hmac.new(key, body, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(claimed, expected) or tail.count(b"\n") != 1:
        raise ReportRejected("the report's signature does not verify (it was not made by the guard)")
    return body


def parse_report(raw: bytes, *, key: bytes, nonce: str, record_id: str) -> GuardReport:
    """The report the guard printed, verified against ``key``, this check's ``nonce`` and the
    manifest ``record_id`` it had to compare against; raises `ReportRejected` otherwise."""
    lines = _verify(raw, key).decode("ascii", errors="strict").split("\n")
    if lines[1:3] != [f"nonce {nonce}", f"id {record_id}"]:
        raise ReportRejected("the report answers another check (a replayed report)")
    report = GuardReport()
    for line in lines[3:]:
        if not line or line == "end":
            continue
        _record(report, line.split(" "))
    return report


def _record(report: GuardReport, parts: list[str]) -> None:
    head, args = parts[0], parts[1:]
    match head, len(args):
        case "marker", 1:
            _int(args[0])
        case "listening", 2:
            report.listening.setdefault(_int(args[0]), _int(args[1]))
        case "kept", 3:
            port = None if args[1] == "-" else _int(args[1])
            report.kept.append(KeptService(_int(args[0]), port, _text(args[2])))
        case "killed", 3:
            report.killed.append(KilledProcess(_int(args[0]), _text(args[1]), _text(args[2])))
        case "unkillable", 1:
            report.unkillable.append(_int(args[0]))
        case "finding", 5 if args[0] in ("changed", "removed", "added") and args[2] in ("f", "d", "l", "o"):
            rule = None if args[1] == "-" else args[1]
            report.findings.append(Finding(args[0], rule, args[2], _text(args[3]), args[4]))  # type: ignore[arg-type]
        case "cured", 1:
            report.cured.append(_text(args[0]))
        case "setaside", 1:
            report.set_aside.append(_text(args[0]))
        case "truncated", 2:
            report.truncated[args[0]] = _int(args[1])
        case "logs", 1:
            report.logs = args[0]
        case "manifest", 1:
            report.manifest = args[0]
        case "entries", 1:
            report.entries = _int(args[0])
        case _:
            raise ReportRejected(f"an unknown report line: {' '.join(parts)[:60]!r}")
