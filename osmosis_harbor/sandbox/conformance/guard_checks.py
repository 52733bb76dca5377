"""The verifier guard on this SDK: what a task's own tests in the agent's sandbox rely on.

The guard (``sandbox/guard``) needs an exec that runs its argv as given (``/proc/<pid>/exe`` of a
daemon, no shell of the sandbox in between), root with a capability to mark processes with, and a
kernel that keeps marked processes from an unmarked one's environment. One check proves all three
on a real sandbox, the way the environment uses them: the guard written with the file API, started,
a command marked, its signed check verified.
"""

from __future__ import annotations

import secrets

from osmosis_harbor.errors import VerifierGuardError
from osmosis_harbor.sandbox.conformance.core import ConformanceContext, check, expect, skip
from osmosis_harbor.sandbox.guard import ReportRejected, commands, guard_binary, parse_report


@check()
async def check_verifier_guard(ctx: ConformanceContext) -> str:
    """The verifier guard starts, marks a command, and its signed check verifies."""
    try:
        binary = guard_binary(config=ctx.settings)
    except VerifierGuardError as exc:
        skip(str(exc))
    sandbox = await ctx.new_sandbox("guard")
    await sandbox.write_bytes.aio(binary.read(), commands.UPLOAD_PATH)
    key, record_id = secrets.token_bytes(32), secrets.token_hex(8)
    out = await ctx.run(sandbox, *commands.start_argv(None, record_id, []), env={commands.KEY_ENV: key.hex()})
    try:
        started = commands.parse_started(out.code or 0, out.stdout.encode(), out.stderr, sandbox.name)
    except VerifierGuardError as exc:
        raise AssertionError(str(exc)) from None
    environ = f"/proc/{started.daemon}/environ"
    marked = await ctx.run(sandbox, *commands.drop_prefix(started.daemon), "cat", environ)
    expect(marked.code != 0 and commands.KEY_ENV not in marked.stdout, "a marked command read the daemon's key")
    nonce = secrets.token_hex(8)
    argv = commands.check_argv(started.daemon, nonce, record_id, [], ports=[], keep_listening=False)
    checked = await ctx.run(sandbox, *argv)
    try:
        report = parse_report(checked.stdout.encode(), key=key, nonce=nonce, record_id=record_id)
    except ReportRejected as exc:
        raise AssertionError(f"the check's report did not verify: {exc}") from None
    expect(report.manifest == "ok" and not report.findings, f"an untouched sandbox has findings: {report.findings}")
    return (
        f"marker capability {started.marker} ({started.arch}), {started.entries} entries recorded; "
        f"start {out.seconds:.2f}s, check {checked.seconds:.2f}s"
    )
