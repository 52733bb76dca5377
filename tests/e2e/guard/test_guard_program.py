"""The guard program itself (``osmosis_harbor/sandbox/guard/guard.c``) in a real sandbox: what the
mark keeps from the agent's processes, what the check ends and finds, and which reports the host
believes. Each attack runs as a marked process (``drop``), as the agent's do; its positive control
runs the same thing unmarked (a command of the host's own) and shows it would pay. The rollouts
that use all of this, on both SDK paths, are ``test_verifier_guard.py``.
"""

from __future__ import annotations

import secrets
import shlex
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox.guard import GuardReport, ReportRejected, guard_binary, parse_report

pytestmark = pytest.mark.slow

IMAGE = "python:3.12-slim"  # a Python for the probes (ptrace through ctypes, a listening socket)
GUARD = "/var/tmp/osmosis-guard"


@dataclass
class Box:
    """A sandbox with a started guard: its daemon's pid and key, the manifest's record id."""

    sandbox: Any
    daemon: int
    key: bytes
    record_id: str

    async def run(self, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        handle = await self.sandbox.exec.aio(*argv, env=env, timeout_seconds=120)
        code = await handle.wait()
        return code, handle.stdout.read(), handle.stderr.read()

    async def host(self, script: str) -> tuple[int, str, str]:
        """A command of the host's own (unmarked): the positive control of an attack."""
        return await self.run("sh", "-c", script)

    async def agent(self, script: str) -> tuple[int, str, str]:
        """A command of the agent phase: marked, as every agent process is."""
        return await self.run(f"/proc/{self.daemon}/exe", "drop", "--", "sh", "-c", script)

    async def check(self, *extra: str, nonce: str | None = None) -> tuple[str, bytes]:
        nonce = nonce or secrets.token_hex(8)
        argv = [f"/proc/{self.daemon}/exe", "check", "--daemon", str(self.daemon), "--nonce", nonce]
        _, out, _ = await self.run(*argv, "--id", self.record_id, "--workdir", "/app", *extra)
        return nonce, out.encode()

    async def report(self, *extra: str) -> GuardReport:
        nonce, raw = await self.check(*extra)
        return parse_report(raw, key=self.key, nonce=nonce, record_id=self.record_id)


@pytest.fixture
async def box(docker_sandbox_sdk: Any) -> AsyncIterator[Box]:
    sandbox = await docker_sandbox_sdk.create.aio(name=f"guard-{uuid.uuid4().hex[:8]}", image=IMAGE, timeout=600)
    try:
        await sandbox.write_bytes.aio(guard_binary(config=settings.current()).read(), GUARD)
        key, record_id = secrets.token_bytes(32), secrets.token_hex(8)
        handle = await sandbox.exec.aio(
            "sh", "-c", f'chmod 755 {GUARD} && mkdir -p /app && exec {GUARD} "$@"', "sh", "start", "--id", record_id,
            "--workdir", "/app", env={"OSMOSIS_GUARD_KEY": key.hex()},
        )  # fmt: skip
        assert await handle.wait() == 0, handle.stderr.read()
        started = handle.stdout.read()
        assert started.startswith("osmosis-guard started pid="), started
        daemon = int(started.split("pid=")[1].split()[0])
        yield Box(sandbox, daemon, key, record_id)
    finally:
        await sandbox.terminate.aio(wait=True)


def _has_mknod(capbnd: str) -> bool:
    """Whether a CapBnd value (the start of ``capbnd``) holds CAP_MKNOD, the guard's mark here."""
    return bool(int(capbnd.split()[0], 16) >> 27 & 1)


PTRACE = "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); r = libc.ptrace(16, int(sys.argv[1]), 0, 0); print(r, ctypes.get_errno()); r == 0 and libc.ptrace(17, int(sys.argv[1]), 0, 0)"


async def test_a_marked_process_cannot_reach_the_daemons_key_and_only_its_signed_report_is_believed(
    box: Box,
) -> None:
    """The daemon holds the key in its environment; an agent process (marked) may neither read it
    nor its memory, attach to it, or resolve its image, and can never win the mark back (a new
    session, a setuid binary, an exec all keep it). Positive control: the host's own command reads
    the key and attaches. Then, in the same sandbox (nothing changed there), the report: believed
    only when the daemon signed it for this check, and never once the agent killed the daemon."""
    probe = (
        f"cat /proc/{box.daemon}/environ | tr '\\0' '\\n' | grep -c OSMOSIS_GUARD_KEY;"
        f" readlink /proc/{box.daemon}/exe; head -c 1 /proc/{box.daemon}/mem;"
        f" python3 -c {shlex.quote(PTRACE)} {box.daemon}"
    )
    code, out, err = await box.agent(f"{probe}; setsid su root -c 'grep CapBnd /proc/self/status'")
    assert "Permission denied" in err and "memfd" not in out, (out, err)
    assert "-1 1" in out  # ptrace(PTRACE_ATTACH): EPERM
    assert not _has_mknod(out.split("CapBnd:")[1])  # the mark (CAP_MKNOD) stays gone after setsid and su
    code, out, err = await box.host(probe)
    assert out.splitlines()[0] == "1" and "/memfd:osmosis-guard (deleted)" in out, (out, err)
    assert "0 0" in out  # the host's own command attaches (and detaches)

    nonce, raw = await box.check()
    report = parse_report(raw, key=box.key, nonce=nonce, record_id=box.record_id)
    assert report.manifest == "ok" and report.findings == [] and report.killed == []
    with pytest.raises(ReportRejected, match="another check"):  # replayed for another check
        parse_report(raw, key=box.key, nonce="0" * 16, record_id=box.record_id)
    with pytest.raises(ReportRejected, match="signature"):  # a key other than the daemon's
        parse_report(raw, key=secrets.token_bytes(32), nonce=nonce, record_id=box.record_id)
    with pytest.raises(ReportRejected, match="signature"):  # a finding removed on the way
        parse_report(raw.replace(b"manifest ok", b"manifest ok\n"), key=box.key, nonce=nonce, record_id=box.record_id)
    # The agent kills the daemon: what runs at its pid is no longer the guard, and nothing signs.
    assert (await box.agent(f"kill -9 {box.daemon}"))[0] == 0
    nonce, raw = await box.check()
    with pytest.raises(ReportRejected):
        parse_report(raw, key=box.key, nonce=nonce, record_id=box.record_id)


def _findings(report: GuardReport) -> dict[str, tuple[str, str | None]]:
    return {f.path: (f.kind, f.rule) for f in report.findings}


async def test_the_check_finds_what_an_agent_changed_in_the_toolchain_and_a_forged_manifest(box: Box) -> None:
    """Changed and removed toolchain files, and added files that a verifier would pick up, are
    findings, and so is anything added in an import, PATH or loader tree (a new package: ``tree``);
    additions elsewhere (a file in the workdir or /usr/local/share) are not; stale bytecode is
    removed and a package cache the agent touched is set aside. Then, in the same sandbox, the
    record itself changed or removed by the agent is a finding of its own."""
    site = "/usr/lib/python3/dist-packages"
    script = "; ".join(
        [
            "mkdir -p /root/.cache/pip/http /usr/local/share/notes /app/pkg /usr/lib/python3.13/__pycache__",
            "echo x > /root/.cache/pip/http/poisoned",
            "echo '#!/bin/sh' > /usr/bin/tail",  # changed
            "rm /usr/bin/tac",  # removed
            f"echo 'import os' > {site}/sitecustomize.py",
            f"echo 'import os' > {site}/zz.pth",
            "echo /usr/lib/x.so > /etc/ld.so.preload",
            "echo /opt/lib > /etc/ld.so.conf.d/evil.conf",
            "printf '#!/bin/sh\\necho 42' > /usr/local/bin/cat && chmod 755 /usr/local/bin/cat",  # shadows /usr/bin/cat
            "printf '#!/bin/sh' > /usr/local/bin/curl && chmod 755 /usr/local/bin/curl",  # a verifier tool
            "echo 'import pytest' > /conftest.py",
            "printf '[pytest]\\naddopts = -p evil\\n' > /app/pytest.ini",
            f"mkdir -p {site}/_pytest {site}/evil-1.0.dist-info {site}/fine-1.0.dist-info",
            f"echo x > {site}/_pytest/__init__.py",
            f"printf '[pytest11]\\nevil = evil\\n' > {site}/evil-1.0.dist-info/entry_points.txt",
            f"printf '[console_scripts]\\nfine = fine\\n' > {site}/fine-1.0.dist-info/entry_points.txt",
            "mkdir -p /tests && echo x > /tests/conftest.py",
            "echo '[global]' > /etc/pip.conf",
            "echo 'deb file:/opt ./' > /etc/apt/sources.list.d/evil.list",
            "echo stale > /usr/lib/python3.13/__pycache__/zz.cpython-313.pyc",
            "echo fine > /usr/local/share/notes/readme.txt",  # benign
            "echo 'print(1)' > /app/pkg/solution.py",  # benign: the workdir is the agent's
        ]
    )
    code, _, err = await box.agent(script)
    assert code == 0, err
    report = await box.report()
    assert _findings(report) == {
        "/usr/bin/tail": ("changed", None),
        "/usr/bin/tac": ("removed", None),
        f"{site}/sitecustomize.py": ("added", "startup-hook"),
        f"{site}/zz.pth": ("added", "startup-hook"),
        "/etc/ld.so.preload": ("added", "loader"),
        "/etc/ld.so.conf.d/evil.conf": ("added", "loader"),
        "/usr/local/bin/cat": ("added", "path-shadow"),
        "/usr/local/bin/curl": ("added", "harness-tool"),
        "/conftest.py": ("added", "pytest-hook"),
        "/app/pytest.ini": ("added", "pytest-hook"),
        f"{site}/_pytest": ("added", "test-runner"),
        f"{site}/_pytest/__init__.py": ("added", "tree"),
        f"{site}/evil-1.0.dist-info": ("added", "tree"),  # a new directory: one finding for its subtree
        f"{site}/fine-1.0.dist-info": ("added", "tree"),
        "/tests": ("added", "tests-dir"),
        "/tests/conftest.py": ("added", "tests-dir"),
        "/etc/pip.conf": ("added", "package-config"),
        "/etc/apt/sources.list.d/evil.list": ("added", "package-config"),
    }
    tail = next(f for f in report.findings if f.path == "/usr/bin/tail")
    assert tail.type == "f" and len(tail.digest) == 64  # what an allowance matches
    assert report.cured == ["/usr/lib/python3.13/__pycache__/zz.cpython-313.pyc"]
    assert report.set_aside == ["/root/.cache/pip"]
    code, out, _ = await box.host("ls /usr/lib/python3.13/__pycache__/zz.cpython-313.pyc /root/.cache; echo $?")
    assert "pip.osmosis-set-aside-" in out and "zz.cpython" not in out

    await box.agent("printf x >> /var/tmp/.osmosis-guard/manifest")
    assert (await box.report()).manifest == "forged"
    await box.agent("rm /var/tmp/.osmosis-guard/manifest")
    assert (await box.report()).manifest == "missing"


async def test_the_trees_cover_every_entry_of_each_pythons_import_path_and_what_the_walk_cannot(
    box: Box,
) -> None:
    """Asked of the interpreter itself, so an entry that does not exist yet (the stdlib zip) is
    covered, and a new file under it is a finding whatever its name. Then, in the same sandbox,
    a tree deeper than the walk goes could hide a change from it: the check says so, signed."""
    _, paths, _ = await box.host("python3 -c 'import sys; print(*[p for p in sys.path if p], sep=chr(10))'")
    _, trees, _ = await box.run(f"/proc/{box.daemon}/exe", "trees")
    roots = trees.split()
    assert "/usr/local/sbin" in roots and "/root/.local/bin" in roots
    for entry in paths.split():
        assert any(entry == r or entry.startswith(r + "/") for r in roots), (entry, roots)
    [zipped] = [p for p in paths.split() if p.endswith(".zip")]
    code, _, err = await box.agent(f"touch {zipped}; mkdir -p /usr/lib/python3.13/newpkg/__pycache__")
    assert code == 0, err
    assert _findings(await box.report()) == {
        zipped: ("added", "tree"),
        "/usr/lib/python3.13/newpkg": ("added", "tree"),  # its new __pycache__ holds only bytecode
    }
    deep = "/usr/local/share/" + "d/" * 210
    await box.agent(f"mkdir -p {deep} && echo x > {deep}x")
    assert (await box.report()).truncated.get("walk", 0) >= 1


async def test_a_new_directory_in_a_tree_is_one_finding_that_names_its_whole_content(box: Box) -> None:
    """A real solution's package install adds more files than a report keeps: the new directory is
    one finding, whose digest covers every entry's path, type, mode and content but the bytecode
    Python writes differently each run (cured). The same tree gives the same digest; one changed
    byte anywhere in it, another."""
    pkg = "/usr/lib/python3/dist-packages/pkg"
    make = (
        f"mkdir -p {pkg}/sub && echo 'x = 1' > {pkg}/__init__.py && echo 'y = {{}}' > {pkg}/sub/m.py && "
        f"for i in $(seq 1 1500); do echo $i > {pkg}/sub/f$i.txt; done && "
        f"python3 -c 'import sys; sys.path.insert(0, \"/usr/lib/python3/dist-packages\"); import pkg.sub.m'"
    )
    digests = []
    for y in ("1", "1", "2"):
        code, _, err = await box.agent(f"rm -rf {pkg}; {make.format(y)}")
        assert code == 0, err
        report = await box.report()
        [found] = report.findings
        assert (found.path, found.kind, found.type) == (pkg, "added", "d") and len(found.digest) == 64
        assert len(report.cured) == 2 and all("/__pycache__/" in p for p in report.cured)
        digests.append(found.digest)
    assert digests[0] == digests[1] != digests[2]


async def test_the_check_ends_the_agents_processes_but_kept_services_and_empties_the_verifier_logs(
    box: Box,
) -> None:
    """Marked processes die, whatever they hide behind; a service on an allowed port lives on with
    its children, still marked; the host's own processes are not the agent's and are left alone.
    Then, in the same sandbox, what the agent left in ``/logs/verifier`` is gone before a verifier
    runs, and a replaced directory is named."""
    serve = "python3 -c 'import socket,sys,time; s=socket.socket(); s.bind((\"127.0.0.1\",int(sys.argv[1]))); s.listen(); time.sleep(600)'"
    await box.host("setsid sleep 600 </dev/null >/dev/null 2>&1 &")  # the host's own
    await box.agent(
        f"setsid {serve} 7001 </dev/null >/dev/null 2>&1 & setsid {serve} 7002 </dev/null >/dev/null 2>&1 &"
        " setsid sh -c 'sleep 600 & wait' </dev/null >/dev/null 2>&1 &"
        " ( ( bash -c 'exec -a /sbin/init sleep 601' </dev/null >/dev/null 2>&1 & ) & )"
    )
    code, _, _ = await box.host(
        "for _ in $(seq 100); do grep -q ':1B59 ' /proc/net/tcp && grep -q ':1B5A ' /proc/net/tcp && exit 0; sleep 0.1; done; exit 1"
    )
    assert code == 0  # both services listen
    report = await box.report("--keep-ports", "7001")
    assert set(report.listening) == {7001, 7002}
    assert [k.port for k in report.kept] == [7001]
    killed = " | ".join(k.cmdline for k in report.killed)
    assert "7002" in killed and "sleep 600" in killed and "/sbin/init" in killed and "7001" not in killed
    _, out, _ = await box.host("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; grep CapBnd $p/status; done")
    alive = out.splitlines()
    assert any("7001" in line for line in alive) and not any("7002" in line or "sleep 601" in line for line in alive)
    assert any(line.startswith("sleep 600") for line in alive)  # the host's own sleeper
    assert not _has_mknod(out.split("7001", 1)[1].split("CapBnd:")[1])  # the kept service is still marked

    await box.agent(
        "mkdir -p /logs/verifier && echo '{\"reward\": 1.0}' > /logs/verifier/reward.json"
        " && mkfifo /logs/verifier/test-stdout.txt 2>/dev/null; mkdir -p /logs/verifier/deep/er && touch /logs/verifier/deep/er/x"
    )
    report = await box.report()
    assert report.logs == "ok"
    _, out, _ = await box.host("ls -A /logs/verifier; stat -c %a /logs/verifier")
    assert out.split() == ["777"]
    await box.agent("rm -rf /logs/verifier && ln -s /tmp /logs/verifier")
    assert (await box.report()).logs == "replaced-verifier"


def test_a_sandbox_whose_root_holds_no_capability_is_refused() -> None:
    """Without a capability to mark the agent's processes with, the guard could protect nothing:
    it refuses to start, saying why (the host turns that into one line, as ``internal_error``)."""
    import docker

    client = docker.from_env()
    container = client.containers.run(IMAGE, ["sleep", "120"], cap_drop=["ALL"], detach=True, auto_remove=False)
    try:
        container.put_archive("/var/tmp", _tar("osmosis-guard", guard_binary(config=settings.current()).read()))
        key = secrets.token_hex(32)
        code, output = container.exec_run(
            [GUARD, "start", "--id", "r1"], environment={"OSMOSIS_GUARD_KEY": key}, demux=True
        )
        assert code == 80 and b"holds no capability to mark the agent's processes" in (output[1] or b""), output
    finally:
        container.remove(force=True)


def _tar(name: str, data: bytes) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
