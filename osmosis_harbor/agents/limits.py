"""Which of its sandbox's limits a failed workflow ran into, so its failure says so.

A workflow killed at its memory limit exits 137 with no word of its own, and one whose forks
were refused fails on EAGAIN; both are the workflow's own failures (``agent_error``), and the
message should name the limit. After a workflow exits non-zero, one read-only command reads the
sandbox's cgroup counters (OOM kills at its memory limit, forks refused at its pids limit; cgroup
v2 or v1, as the sandbox sees its own). What it prints is the sandbox's: only integers are taken
from it, and the note changes the message, never the category. Costs one exec per failed
workflow, none on success.
"""

from __future__ import annotations

from harbor.environments.base import BaseEnvironment

__all__ = ["LIMITS_MARK", "limits_note", "parse_limits"]

LIMITS_MARK = "the sandbox's limits: "
PROBE_TIMEOUT_SEC = 30
_PROBE = (
    'cg=/sys/fs/cgroup; rd() { cat "$1" 2>/dev/null; }; '
    "if [ -f $cg/memory.events ]; then m=$cg/memory.events; else m=$cg/memory/memory.oom_control; fi; "
    "if [ -f $cg/pids.events ]; then p=$cg; else p=$cg/pids; fi; "
    'echo "oom $(rd $m | grep "^oom_kill ")"; echo "pids $(rd $p/pids.events | grep "^max ") $(rd $p/pids.max)"'
)


def _count(text: str) -> int | None:
    """The last field of a counter line, if it is a small non-negative integer."""
    field = text.split()[-1] if text.split() else ""
    return int(field) if field.isdigit() and len(field) < 12 else None


def parse_limits(output: str) -> str | None:
    """The note for the probe's output, or None when no limit was hit."""
    lines = {key: rest for key, _, rest in (line.partition(" ") for line in output.splitlines()[:4])}
    hits = []
    oom = _count(lines.get("oom", ""))
    if oom:
        hits.append(f"its memory limit killed {oom} process{'es' if oom > 1 else ''} (OOM)")
    pids = lines.get("pids", "").split()
    refused = _count(" ".join(pids[:2])) if len(pids) >= 2 and pids[0] == "max" else None
    if refused:
        bound = pids[2] if len(pids) > 2 and pids[2].isdigit() else "?"
        hits.append(f"its pids limit ({bound} tasks) refused {refused} fork{'s' if refused > 1 else ''}")
    return LIMITS_MARK + "; ".join(hits) if hits else None


async def limits_note(environment: BaseEnvironment) -> str | None:
    """The note for a sandbox whose workflow just failed; None when no limit was hit or the
    sandbox could not be asked (a probe that cannot start says so when its pids are taken)."""
    try:
        result = await environment.exec(_PROBE, timeout_sec=PROBE_TIMEOUT_SEC, user="root")
    except Exception:  # lost, evicted, or the engine could not start it: the failure stands as it is
        return None
    output = (result.stdout or "")[:4096]
    if result.return_code != 0 and "fork" in (result.stderr or "").lower():
        return LIMITS_MARK + "it could not start a process (its pids limit is taken)"
    return parse_limits(output)
