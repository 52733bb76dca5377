"""What root in a sandbox may do to its neighbours: its capability set and no-new-privileges.

Read from ``/proc/self/status`` of a command run as the sandbox's default user (root), so a team
with SkyPilot access sees what its pods give (the SDK has no capability knob; the cluster's
runtime and pod policy decide). It fails where a sandbox keeps CAP_NET_RAW (raw and packet
sockets: ARP spoofing of the other sandboxes on its network) or runs without
no-new-privileges; the detail names the whole set either way.
"""

from __future__ import annotations

from pydantic import BaseModel

from osmosis_harbor.sandbox.conformance.core import ConformanceContext, check, expect
from osmosis_harbor.sandbox.sdk.privileges import capability_names

__all__ = ["Privileges", "parse_privileges"]

PRIVILEGES_SCRIPT = "grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status"


class Privileges(BaseModel):
    """A process's capability sets and no-new-privileges flag, as the kernel reports them."""

    effective: list[str]
    bounding: list[str]
    no_new_privileges: bool | None  # None: the kernel does not report it

    def describe(self) -> str:
        bounding = "the same" if self.bounding == self.effective else ", ".join(self.bounding) or "none"
        flag = {True: "set", False: "not set", None: "not reported"}[self.no_new_privileges]
        return (
            f"capabilities {', '.join(self.effective) or 'none'} (bounding set: {bounding}); no-new-privileges {flag}"
        )


def parse_privileges(text: str) -> Privileges:
    fields = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines() if ":" in ln)}
    expect("CapEff" in fields and "CapBnd" in fields, f"no capability sets in /proc/self/status: {text!r}")
    flag = fields.get("NoNewPrivs")
    return Privileges(
        effective=capability_names(int(fields["CapEff"], 16)),
        bounding=capability_names(int(fields["CapBnd"], 16)),
        no_new_privileges=None if flag is None else flag == "1",
    )


@check()
async def check_privileges(ctx: ConformanceContext) -> str:
    """Root in a sandbox has no raw sockets (NET_RAW) and runs with no-new-privileges."""
    out = await ctx.sh(await ctx.shared(), PRIVILEGES_SCRIPT)
    expect(out.code == 0, f"reading /proc/self/status failed (exit {out.code}): {out.stderr[:200]}")
    privileges = parse_privileges(out.stdout)
    detail = privileges.describe()
    expect(
        "NET_RAW" not in privileges.bounding,
        f"NET_RAW is in the sandbox's capability set: it can forge ARP and read its neighbours' traffic ({detail})",
    )
    expect(privileges.no_new_privileges is True, f"setuid binaries can raise privileges in the sandbox ({detail})")
    return detail
