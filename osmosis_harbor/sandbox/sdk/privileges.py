"""What root in a sandbox may do beyond its own files: the capabilities it keeps, and whether a
setuid binary can raise a process's privileges (``no-new-privileges``).

Docker's default set gives every container CAP_NET_RAW: raw and packet sockets, with which one
sandbox forges ARP on the bridge all sandboxes share and reads or cuts off another's traffic
(the bridge's ``enable_icc=false`` is an iptables rule, and ARP is not IP). It also gives
CAP_AUDIT_WRITE, which writes records into the host kernel's audit log (not namespaced). Both
are dropped: nothing a workflow does to install packages or switch users needs them (ping uses
ICMP datagram sockets, which the engine opens to every group of a container). The rest of the
default set stays: apt, dpkg and pip need CHOWN, DAC_OVERRIDE, FOWNER and FSETID; su, setpriv,
runuser and sudo need SETUID and SETGID; KILL, NET_BIND_SERVICE, SYS_CHROOT (sshd's privilege
separation) and SETFCAP serve real tasks; MKNOD and SETPCAP serve the dataset verifier's guard.

``no-new-privileges`` makes setuid and file capabilities inert: root stays root, and a task's
unprivileged ``[agent] user`` cannot become root through ``sudo`` or ``su``
(``Settings.sandbox_no_new_privileges`` turns it off for a task that relies on that).

The seccomp profile is the engine's default unless the operator gives one
(``Settings.sandbox_seccomp_profile``; ``seccomp.py`` says why one would).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from osmosis_harbor.sandbox.sdk.seccomp import read_profile

__all__ = ["CAPABILITY_NAMES", "DROPPED_CAPABILITIES", "PrivilegeSettings", "SandboxPrivileges", "capability_names"]

DROPPED_CAPABILITIES = ("NET_RAW", "AUDIT_WRITE")
NO_NEW_PRIVILEGES = "no-new-privileges"

# Linux capability numbers (include/uapi/linux/capability.h), for reading /proc/<pid>/status.
CAPABILITY_NAMES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip


def capability_names(mask: int) -> list[str]:
    """The capabilities set in a ``CapEff``/``CapBnd`` mask (unknown bits as ``CAP_<n>``)."""
    return [
        CAPABILITY_NAMES[bit] if bit < len(CAPABILITY_NAMES) else f"CAP_{bit}"
        for bit in range(mask.bit_length())
        if mask >> bit & 1
    ]


class PrivilegeSettings(Protocol):
    """The two settings the privileges are made from (``Settings`` has them, and so does the
    Docker SDK's config)."""

    @property
    def sandbox_no_new_privileges(self) -> bool: ...

    @property
    def sandbox_seccomp_profile(self) -> Path | None: ...


class SandboxPrivileges(BaseModel):
    """The privilege options one sandbox container is created with (one decision, as data)."""

    model_config = ConfigDict(frozen=True)

    cap_drop: tuple[str, ...] = DROPPED_CAPABILITIES
    no_new_privileges: bool = True
    seccomp: str | None = None  # the operator's profile (JSON text); None: the engine's default

    @classmethod
    def of(cls, current: PrivilegeSettings) -> SandboxPrivileges:
        """The privileges ``current`` (the caller's one reading of the settings) asks for."""
        profile = current.sandbox_seccomp_profile
        return cls(
            no_new_privileges=current.sandbox_no_new_privileges,
            seccomp=read_profile(profile) if profile is not None else None,
        )

    def host_config(self) -> dict[str, Any]:
        """Keywords of the Docker SDK's ``create_host_config``."""
        options = [NO_NEW_PRIVILEGES] if self.no_new_privileges else []
        if self.seccomp is not None:
            options.append(f"seccomp={self.seccomp}")
        return {"cap_drop": list(self.cap_drop), "security_opt": options or None}
