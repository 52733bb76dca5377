"""Transfers that ride a command's own exec on SkyPilot's path: the upload a command needs
unpacked just before it, and the ``/logs`` fetch that follows it packed just after it.

Why: on SkyPilot every exec is two API calls (a launch and a result read), and Harbor's trial
puts an upload's unpack command right before the verifier's ``test.sh`` and a pack command
right after it and after the agent's run. Riding those commands saves two calls each, and a
small archive delivered in the command's own output saves the read too. Each fold is one
small POSIX ``sh`` wrapper (``FOLD``) around the command's argv, under the exec record.

Why neither fold can cost a rollout its reward, nor hand a sandbox a way to hide one:

* **The pack after the command** is a guess the host checks: a trailer line at the very end of
  the command's stderr names the archive (inline, base64, when small; else its size and temp
  file). Anything doubtful (no trailer, a trailer that does not parse or is not the last line,
  an archive over the bounds or unreadable) adopts nothing, and the download then runs the
  ordinary pack command, exactly as without the fold. What the trailer says is sandbox output,
  as the ordinary pack command's is: it can only be as false as the files it packs could be.
* **The upload before the command** fails visibly only with a secret. The staged file the host
  writes starts with 32 random hex digits. The wrapper removes the file before the command
  starts, and prints the secret (straight from the file, never through a shell variable) only
  when the unpack failed, in which case the command never runs. So a "the upload failed" the
  command itself prints cannot carry the secret: the host believes only the one that does, and
  otherwise the result is the command's. The upload fold is used only where no process of the
  workflow can be alive to read the staged file first: the verifier's ``test.sh`` command, in a
  separate verifier's fresh sandbox or after the verifier guard's check has ended every
  process the agent left.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import shlex
from dataclasses import dataclass

from harbor.environments.base import ExecResult

__all__ = [
    "FOLD",
    "FoldedPack",
    "Trailer",
    "UploadFold",
    "fold_argv",
    "is_verifier_test_command",
    "read_trailer",
    "upload_failure",
]

# The most of an archive delivered inside the command's stderr (base64, so 4/3 of it): well
# under the exec output bound, which is the last 4 MiB of each stream.
INLINE_MAX_BYTES = 192 * 1024
TRAILER = "osmosis-harbor-packed"
SECRET_HEX = 32
# $1: the staged upload ("-": none), $2: the preparation shell run before its unpack, $3: the
# archive to pack into after the command ("-": none), $4: the trailer's id, $5: the inline
# bound, $6: the trees to pack, shell-quoted names under /; then the command's argv. The
# command's exit status is the wrapper's; the pack's never is.
FOLD = (
    "f=$1 prep=$2 a=$3 id=$4 im=$5 r=$6; shift 6; "
    'if [ "$f" != - ]; then '
    'if { eval "$prep" && tail -c +' + str(SECRET_HEX + 2) + ' "$f" | tar -xzf - -C /; } >"$f.err" 2>&1; then '
    'rm -f "$f" "$f.err"; else '
    "head -c "
    + str(SECRET_HEX)
    + ' "$f" >&2; printf " " >&2; head -c 400 "$f.err" >&2; rm -f "$f" "$f.err"; exit 97; fi; fi; '
    '"$@"; rc=$?; '
    'if [ "$a" != - ]; then eval "set -- $r"; first=$1; '
    'if [ -e "/$first" ] || [ -L "/$first" ]; then '
    'i=0; idx=; for p do shift; if [ -e "/$p" ] || [ -L "/$p" ]; then set -- "$@" "$p"; idx="$idx $i"; fi; i=$((i+1)); done; '
    'tar -czf "$a" -C / "$@" 2>/dev/null; t=$?; '
    'if [ "$t" -le 1 ] && [ -f "$a" ]; then s=$(wc -c <"$a"); b=; '
    'if [ "$s" -le "$im" ] && command -v base64 >/dev/null 2>&1; then b=$(base64 <"$a" | tr -d "\\n"); fi; '
    'if [ -n "$b" ]; then rm -f "$a"; printf "\\n' + TRAILER + ':%s:inline:%s:%s\\n" "$id" "$idx" "$b" >&2; '
    'else printf "\\n' + TRAILER + ':%s:file:%s:%s\\n" "$id" "$idx" "$s" >&2; fi; fi; fi; fi; '
    "exit $rc"
)

# Harbor's verifier command (``harbor.utils.scripts.build_execution_command`` with a stdout
# path under the verifier's log dir), after which its verifier downloads ``/logs/verifier``.
_VERIFIER_TEST = re.compile(r"\(.+\) > '?/logs/verifier/[^ ]+'? 2>&1", re.DOTALL)


def is_verifier_test_command(command: str) -> bool:
    return _VERIFIER_TEST.fullmatch(command) is not None


@dataclass(frozen=True)
class UploadFold:
    """A staged upload written to ``remote``, to be unpacked before the command (with the
    staged ``preparation`` shell first)."""

    remote: str
    preparation: str
    secret: str

    @staticmethod
    def new(remote: str, preparation: str) -> UploadFold:
        return UploadFold(remote, preparation or ":", secrets.token_hex(SECRET_HEX // 2))

    def payload(self, gzipped: bytes) -> bytes:
        return self.secret.encode() + b"\n" + gzipped


@dataclass(frozen=True)
class FoldedPack:
    """The trees to pack after the command (``roots``, the first one required) into ``remote``."""

    roots: tuple[str, ...]
    remote: str
    id: str


@dataclass(frozen=True)
class Trailer:
    """What the pack after the command says it made: the roots present, and the archive inline
    (``data``) or left at the pack's remote path (``size``)."""

    present: tuple[str, ...]
    data: bytes | None
    size: int


def fold_argv(argv: list[str], upload: UploadFold | None, pack: FoldedPack | None) -> list[str]:
    roots = " ".join(shlex.quote(r.strip("/")) for r in pack.roots) if pack is not None else ""
    return [
        "sh",
        "-c",
        FOLD,
        "sh",
        upload.remote if upload is not None else "-",
        upload.preparation if upload is not None else ":",
        pack.remote if pack is not None else "-",
        pack.id if pack is not None else "-",
        str(INLINE_MAX_BYTES),
        roots,
        *argv,
    ]


def upload_failure(result: ExecResult, upload: UploadFold) -> str | None:
    """The folded upload's failure, when the wrapper reported it (the secret is there), with the
    secret removed; None when the command ran."""
    stderr = result.stderr or ""
    if upload.secret not in stderr:
        return None
    return stderr.replace(upload.secret, "").strip()[:500] or "no output"


def read_trailer(result: ExecResult, pack: FoldedPack) -> tuple[ExecResult, Trailer | None]:
    """The command's result without the pack's trailer, and the trailer when it is the last
    line of stderr and parses (else None: nothing is adopted)."""

    stderr = result.stderr or ""
    mark = f"\n{TRAILER}:{pack.id}:"
    at = stderr.rfind(mark)
    if at < 0:
        return result, None
    line = stderr[at + len(mark) :]
    stripped = ExecResult(stdout=result.stdout, stderr=stderr[:at], return_code=result.return_code)
    if "\n" in line.rstrip("\n"):
        return stripped, None  # something was written after it: not ours to believe
    try:
        kind, indices, payload = line.rstrip("\n").split(":", 2)
        present = tuple(pack.roots[int(i)] for i in indices.split())
        if not present or present[0] != pack.roots[0]:
            return stripped, None
        if kind == "inline":
            data = base64.b64decode(payload, validate=True)
            return stripped, Trailer(present, data, len(data))
        if kind == "file" and payload.isdigit():
            return stripped, Trailer(present, None, int(payload))
    except (ValueError, IndexError, binascii.Error):
        pass
    return stripped, None
