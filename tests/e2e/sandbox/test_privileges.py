"""What a root workflow needs still works in a sandbox without NET_RAW and AUDIT_WRITE and with
no-new-privileges, and what no-new-privileges takes away is what it should.

Real installs, on the Docker path: ``apt-get install`` from Debian's mirror (dpkg's chowns and
setuid/setgid files, apt's switch to its ``_apt`` user), ``pip install`` from PyPI through the
host's CA as the images set it up, then switching users with ``su``, ``runuser``, ``setpriv`` and
``sudo`` as root, ``chown``, and ``ping`` (ICMP datagram sockets, no raw socket). What
no-new-privileges costs: a task's unprivileged ``[agent] user`` cannot become root through
``sudo`` (a setuid binary); the control, with the setting off, shows that it is the flag that
stops it.

One path suffices: the emulator's server makes its sandboxes through the same Docker
implementation, so with the same capabilities and flag, and what the installs need of an exec
(root, a shell) is the same on both; the capability set and no-new-privileges of the emulator's
sandboxes are read by the conformance suite's privileges check on both paths
(``test_sandbox_check.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox import load_sandbox_sdk
from osmosis_harbor.sandbox.conformance.core import ConformanceContext
from osmosis_harbor.sandbox.conformance.privilege_checks import PRIVILEGES_SCRIPT, parse_privileges
from tests.support.sdk_paths import DOCKER_PATH_ONLY, SdkPath

pytestmark = pytest.mark.slow

IMAGE = "python:3.12-slim"  # Debian trixie, with the host's CA for pip (PIP_CERT)
INSTALL_AND_SWITCH = r"""
set -e
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sudo iputils-ping >/dev/null
pip install --no-cache-dir -q six
python3 -c 'import six'
useradd -m agent
echo 'agent ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/agent
echo "su $(su -s /bin/sh agent -c 'id -un')"
echo "runuser $(runuser -u agent -- id -un)"
echo "setpriv $(setpriv --reuid=agent --regid=agent --init-groups id -un)"
echo "sudo $(sudo -u agent id -un 2>/dev/null)"
mkdir /srv/owned && chown agent:agent /srv/owned && echo "chown $(stat -c %U /srv/owned)"
ping -c 1 -W 2 127.0.0.1 >/dev/null && echo "ping ok"
"""
AGENT_SUDO = "su -s /bin/sh agent -c 'sudo -n id -un'"


async def _installed(ctx: ConformanceContext) -> Any:
    sandbox = await ctx.new_sandbox("installs")
    out = await ctx.sh(sandbox, INSTALL_AND_SWITCH, timeout=600)
    assert out.code == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.split("\n")[-7:-1] == [
        "su agent",
        "runuser agent",
        "setpriv agent",
        "sudo agent",
        "chown agent",
        "ping ok",
    ], out.stdout
    return sandbox


@DOCKER_PATH_ONLY
async def test_a_root_workflow_installs_packages_and_switches_users(sandbox_sdk: SdkPath) -> None:
    ctx = ConformanceContext(sdk=load_sandbox_sdk(sandbox_sdk.name), image=IMAGE, settings=settings.current())
    try:
        sandbox = await _installed(ctx)
        privileges = parse_privileges((await ctx.sh(sandbox, PRIVILEGES_SCRIPT)).stdout)
        assert "NET_RAW" not in privileges.bounding and "AUDIT_WRITE" not in privileges.bounding
        assert {"CHOWN", "SETUID", "SETGID", "MKNOD", "SETPCAP"} <= set(privileges.bounding)
        assert privileges.no_new_privileges is True
        escalation = await ctx.sh(sandbox, AGENT_SUDO)
    finally:
        await ctx.close()
    assert escalation.code != 0 and "no new privileges" in escalation.stderr, escalation


async def test_control_without_no_new_privileges_the_agent_user_becomes_root(
    docker_sandbox_sdk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_SANDBOX_NO_NEW_PRIVILEGES", "0")
    ctx = ConformanceContext(sdk=docker_sandbox_sdk, image=IMAGE, settings=settings.current())
    try:
        sandbox = await _installed(ctx)
        escalation = await ctx.sh(sandbox, AGENT_SUDO)
    finally:
        await ctx.close()
    assert escalation.code == 0 and escalation.stdout.strip() == "root", escalation
