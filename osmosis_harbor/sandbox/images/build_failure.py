"""Why an image build failed, on one screen: the failing step, its exit code, its last lines.

Both builders' output is read. The legacy builder's (the Docker SDK's stream, and the Docker
CLI without BuildKit, which Harbor's own build runs): ``Step 3/4 : RUN ...`` then ``The command
'/bin/sh -c ...' returned a non-zero code: 2``. BuildKit's: ``#7 [3/4] RUN ...``, its output as
``#7 0.31 ...`` and ``ERROR: process "..." did not complete successfully: exit code: 2``. The
tail is the failing step's own output (the builder's bookkeeping dropped, and the colouring the
legacy builder wraps a step's stderr in), at most ``TAIL_LINES`` lines and about ``TAIL_BYTES``
bytes, with the host's secret-looking values redacted (``settings.secret_values``). Other control
characters are the build's own and stay: whoever shows the text escapes them (``trials.printable``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from osmosis_harbor import settings
from osmosis_harbor.shim.errors import REDACTED

__all__ = ["TAIL_BYTES", "TAIL_LINES", "BuildFailure", "last_lines", "parse_build_failure"]

TAIL_LINES = 20
TAIL_BYTES = 2048
STEP_CHARS = 160  # a RUN step's command can be kilobytes (the bundle patch's is): shown shortened
_BUILDER_COLOURS = re.compile(r"\x1b\[(?:91|0)m")  # the legacy builder's stderr start and end
_LEGACY_STEP = re.compile(r"^Step (\d+/\d+) : (.*)$")
_LEGACY_EXIT = re.compile(r"returned a non-zero code: (\d+)")
_LEGACY_NOISE = re.compile(r"^(?: ---> |Removing intermediate container |Sending build context )")
_KIT_STEP = re.compile(r"^#(\d+) \[(?:[\w.-]+ )?(\d+/\d+)\] (.*)$")
_KIT_LINE = re.compile(r"^#(\d+) (\d+\.\d+ )?(.*)$")  # a timestamp: the step's own output
_KIT_EXIT = re.compile(r"exit code: (\d+)")
_KIT_NOISE = re.compile(r"^(?:DONE \d|CACHED$|ERROR: process )")


@dataclass(frozen=True)
class BuildFailure:
    """One failed build, as parsed from its output."""

    ref: str
    step: str | None  # "3/4 (RUN pip install ...)", shortened
    exit_code: int | None
    tail: str  # the failing step's last output lines (or the build's, when no step was found)

    def message(self) -> str:
        """The summary line (what a table shows), then the tail under a header line."""
        head = f"docker build failed for {self.ref}"
        if self.step is not None:
            head += f" at step {self.step}"
        if self.exit_code is not None:
            head += f", exit code {self.exit_code}"
        return f"{head}\n--- build output (last lines) ---\n{self.tail}" if self.tail else head


def parse_build_failure(ref: str, output: str, error: str = "") -> BuildFailure:
    """``ref``'s failed build, from the builder's ``output`` and its final ``error`` line."""
    text = _BUILDER_COLOURS.sub("", output.replace("\r\n", "\n"))
    error = _BUILDER_COLOURS.sub("", error).strip()
    lines = text.splitlines()
    parsed = _buildkit(lines) if any(_KIT_STEP.match(line) for line in lines) else _legacy(lines)
    step, exit_code, step_lines = parsed
    if exit_code is None:
        found = _LEGACY_EXIT.search(error) or _KIT_EXIT.search(error)
        exit_code = int(found.group(1)) if found else None
    if step is None:  # nothing recognisable: the engine's own words, then the output's end
        step_lines = [line for line in [error.splitlines()[0] if error else "", *lines] if line.strip()]
    return BuildFailure(ref=ref, step=step, exit_code=exit_code, tail=last_lines("\n".join(step_lines)))


def _shortened(instruction: str) -> str:
    instruction = " ".join(instruction.split())
    return instruction if len(instruction) <= STEP_CHARS else instruction[: STEP_CHARS - 1] + "…"


def _legacy(lines: list[str]) -> tuple[str | None, int | None, list[str]]:
    step: str | None = None
    exit_code: int | None = None
    output: list[str] = []
    for line in lines:
        if match := _LEGACY_STEP.match(line):
            step, output = f"{match.group(1)} ({_shortened(match.group(2))})", []
        elif match := _LEGACY_EXIT.search(line):
            exit_code = int(match.group(1))
            before = line[: line.find("The command")].rstrip() if "The command" in line else ""
            if before:  # output without a final newline runs into the builder's message
                output.append(before)
        elif not _LEGACY_NOISE.match(line):
            output.append(line)
    return step, exit_code, output


def _buildkit(lines: list[str]) -> tuple[str | None, int | None, list[str]]:
    steps: dict[str, str] = {}
    output: dict[str, list[str]] = {}
    failed, exit_code = None, None
    for line in lines:
        if match := _KIT_STEP.match(line):
            steps[match.group(1)] = f"{match.group(2)} ({_shortened(match.group(3))})"
        elif match := _KIT_LINE.match(line):
            step_id, timestamp, rest = match.groups()
            if timestamp is None and rest.startswith("ERROR"):
                failed = step_id
                code = _KIT_EXIT.search(rest)
                exit_code = int(code.group(1)) if code else exit_code
            elif timestamp is not None or not _KIT_NOISE.match(rest):
                output.setdefault(step_id, []).append(rest)
        elif (code := _KIT_EXIT.search(line)) and exit_code is None:
            exit_code = int(code.group(1))
    if failed is None and steps:
        failed = list(steps)[-1]
    return steps.get(failed or ""), exit_code, output.get(failed or "", [])


def last_lines(text: str, *, max_lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last lines of ``text`` (at most ``max_lines``, about ``max_bytes``), redacted."""
    for secret in settings.secret_values():
        text = text.replace(secret, REDACTED)
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    tail = "\n".join(lines[-max_lines:])
    while len(tail.encode()) > max_bytes and "\n" in tail:
        tail = tail.split("\n", 1)[1]
    if len(tail.encode()) > max_bytes:  # one long line: its end
        tail = "…" + tail.encode()[-(max_bytes - 3) :].decode("utf-8", errors="ignore")
    return tail
