"""Package managers' progress lines, left out of the output tails a failure report shows.

A verifier that installs its test runner first (``apt-get install curl``, uv's installer,
``uvx pytest``) fills the last lines of its output with ``Get:``/``Setting up`` lines and download
progress, and a 20-line tail then shows little else. Only lines that report progress are
recognised: errors and warnings (apt's ``E:``/``Err:``, uv's ``error: Failed to download``, pip's
``ERROR:``) never match, so what explains a failure stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

__all__ = ["without_progress"]

_SIZE = r"[\d.,]+\s?[kKMGT]?i?B"
PROGRESS = re.compile(
    "|".join(
        (
            # apt and dpkg
            r"(?:Get|Hit|Ign):\d+ \S+",
            rf"Fetched {_SIZE} in ",
            r"(?:Reading package lists|Building dependency tree|Reading state information)\b",
            r"(?:Selecting previously unselected package|Preparing to unpack|Unpacking|Setting up"
            r"|Processing triggers for) ",
            r"\(Reading database \.\.\.",
            r"debconf: (?:delaying|unable to initialize|falling back)",
            r"\d+ upgraded, \d+ newly installed, ",
            rf"Need to get {_SIZE}",
            r"After this operation, ",
            r"update-alternatives: using ",
            r"(?:The following (?:additional |NEW )?packages will be (?:installed|upgraded)"
            r"|Suggested packages|Recommended packages):$",
            # pip
            r"(?:Collecting|Downloading|Using cached|Obtaining|Requirement already satisfied:) ",
            r"(?:Installing collected packages:|Successfully installed|Successfully uninstalled) ",
            r"(?:Installing build dependencies|Getting requirements to build|Preparing metadata|Building wheels? for"
            r"|Created wheel for|Stored in directory:)",
            r"[━╸╺\s]*━[━╸╺\s]* [\d.]+/[\d.]+ [kKMG]?B ",
            r"WARNING: Running pip as the 'root' user",
            r"\[notice\] ",
            # uv, and uv's installer (which cannot download anything offline)
            r"(?:Resolved|Prepared|Installed|Uninstalled|Audited|Built|Downloaded) \d+ packages? in ",
            r"(?:Downloading|Downloaded|Building|Built) \S+(?: \(\S+\))?$",
            r"[+~-] \S+==\S+$",
            r"(?:Using CPython|Creating virtual environment at|Activate with:) ",
            r"(?:downloading uv |installing to |everything's installed!|no checksums to verify)",
            r"uvx?$",
            # curl's progress meter
            r"% Total +% Received",
            r"Dload +Upload",
            r"\d{1,3} +\S+ +\d{1,3} +\S+ +\d+ +\d+ +\S+ +\S+ +[\d:-]{8} +[\d:-]{8} +[\d:-]{8} +\S+$",
        )
    )
)
# The indented package names apt lists under "The following NEW packages will be installed:".
_APT_LIST_ITEM = re.compile(r"^ {2}\S")
# A line that says something went wrong is never progress, whatever it starts with.
_TROUBLE = re.compile(r"error|fail|denied|not found|unable|cannot", re.IGNORECASE)


def _shown(line: str) -> str:
    """What a terminal showed of a line redrawn with carriage returns: its last part."""
    parts = [part for part in line.split("\r") if part]
    return parts[-1] if parts else ""


def without_progress(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` as a terminal showed them, each run of progress lines replaced by one line
    saying how many were left out."""
    dropped = 0
    in_apt_list = False
    for raw in lines:
        line = _shown(raw)
        stripped = line.strip()
        if stripped and _TROUBLE.search(stripped) is None:
            if PROGRESS.match(stripped):
                in_apt_list = stripped.endswith(":")  # a package list's header: its items follow
                dropped += 1
                continue
            if in_apt_list and _APT_LIST_ITEM.match(line):
                dropped += 1
                continue
        in_apt_list = False
        if dropped:
            yield _left_out(dropped)
            dropped = 0
        yield line
    if dropped:
        yield _left_out(dropped)


def _left_out(count: int) -> str:
    return f"[{count} package-manager progress line{'s' if count != 1 else ''} left out]"
