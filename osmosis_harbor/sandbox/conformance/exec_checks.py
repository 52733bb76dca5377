"""Checks of ``exec``: output, exit codes, argv, timeouts, workdir, env scoping, users."""

from __future__ import annotations

import asyncio
import time
import uuid

from osmosis_harbor.sandbox.conformance.core import (
    NON_ROOT_USER,
    ConformanceContext,
    as_user,
    check,
    ensure_user,
    expect,
    poll,
)

# ── exec ─────────────────────────────────────────────────────────────────────────────────────


@check()
async def check_exec_stdout_and_exit_code(ctx: ConformanceContext) -> str:
    """stdout is returned and the command's exit code is reported."""
    out = await ctx.sh(await ctx.shared(), "echo hello; exit 3")
    expect(out.stdout == "hello\n", f"stdout {out.stdout!r} != 'hello\\n'")
    expect(out.code == 3, f"exit code {out.code} != 3")
    return f"exec round trip {out.seconds * 1000:.0f} ms"


@check()
async def check_exec_stderr_is_separate(ctx: ConformanceContext) -> str:
    """stderr is captured separately from stdout."""
    out = await ctx.sh(await ctx.shared(), "echo to-out; echo to-err >&2")
    expect(out.stdout == "to-out\n", f"stdout {out.stdout!r}")
    expect(out.stderr == "to-err\n", f"stderr {out.stderr!r}")
    return "ok"


@check()
async def check_exec_exit_codes(ctx: ConformanceContext) -> str:
    """true/false/explicit codes map exactly; a missing binary is a non-zero exit or an error."""
    sandbox = await ctx.shared()
    for argv, want in ((["true"], 0), (["false"], 1), (["sh", "-c", "exit 42"], 42)):
        got = (await ctx.run(sandbox, *argv)).code
        expect(got == want, f"{argv} exited {got}, expected {want}")
    try:
        missing = (await ctx.run(sandbox, "/no/such/binary-xyz")).code
    except Exception as exc:  # noqa: BLE001 - an implementation may refuse to start it
        return f"missing binary raised {type(exc).__name__}"
    expect(missing not in (0, None), f"missing binary exited {missing}")
    return f"missing binary exit code {missing}"


@check()
async def check_exec_no_implicit_shell(ctx: ConformanceContext) -> str:
    """argv is not re-interpreted by a shell: no expansion, globbing or command separators."""
    words = ["$HOME", "a;b", "*", "`id`", "$(id)", "x|y", "&&"]
    out = await ctx.run(await ctx.shared(), "echo", *words)
    expect(out.stdout == " ".join(words) + "\n", f"echo printed {out.stdout!r}")
    return "metacharacters passed literally"


@check()
async def check_exec_argv_preserved(ctx: ConformanceContext) -> str:
    """Spaces, quotes, newlines, unicode and empty arguments survive as separate argv items."""
    args = ["a b", "it's", '"dq"', "line1\nline2", "ünï😀", "", "--flag=x y"]
    out = await ctx.run(await ctx.shared(), "printf", "[%s]", *args)
    want = "".join(f"[{a}]" for a in args)
    expect(out.stdout == want, f"printf printed {out.stdout!r}, expected {want!r}")
    return "ok"


@check()
async def check_exec_timeout_kills_process_group(ctx: ConformanceContext) -> str:
    """A timed-out command returns promptly with a non-zero code and its children die too."""
    sandbox = await ctx.shared()
    marker = str(4000 + int(uuid.uuid4().hex[:3], 16) % 999)
    script = f"sleep {marker} & sleep {int(marker) + 1}; echo finished"
    out = await ctx.sh(sandbox, script, timeout=2)
    expect(out.code not in (0, None), f"timed-out command exited {out.code}")
    expect("finished" not in out.stdout, "command ran to completion despite the timeout")
    expect(out.seconds < 15, f"wait() returned after {out.seconds:.1f}s for a 2s timeout")

    async def no_leftovers() -> bool:
        scan = await ctx.sh(sandbox, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
        return f"sleep {marker}" not in scan.stdout and f"sleep {int(marker) + 1}" not in scan.stdout

    await poll(no_leftovers, timeout=10, what="background child of the timed-out command still running")
    return f"exit code {out.code} after {out.seconds:.1f}s"


@check()
async def check_exec_large_output(ctx: ConformanceContext) -> str:
    """Megabytes of stdout arrive intact."""
    out = await ctx.sh(await ctx.shared(), "head -c 2097152 /dev/zero | tr '\\0' 'x'")
    expect(out.code == 0, f"exit {out.code}: {out.stderr[:200]}")
    expect(out.stdout == "x" * 2097152, f"got {len(out.stdout)} chars, expected 2097152 'x'")
    return f"2 MiB in {out.seconds:.2f}s"


@check()
async def check_exec_concurrent(ctx: ConformanceContext) -> str:
    """Several commands in one sandbox run in parallel, not one after another."""
    sandbox = await ctx.shared()
    started = time.monotonic()
    outs = await asyncio.gather(*(ctx.run(sandbox, "sleep", "1") for _ in range(4)))
    elapsed = time.monotonic() - started
    expect(all(o.code == 0 for o in outs), f"exit codes {[o.code for o in outs]}")
    expect(elapsed < 3.5, f"4 parallel 1s sleeps took {elapsed:.1f}s")
    return f"4 x sleep 1 in {elapsed:.2f}s"


@check()
async def check_exec_workdir(ctx: ConformanceContext) -> str:
    """workdir sets the command's current directory."""
    sandbox = await ctx.shared()
    await ctx.run(sandbox, "mkdir", "-p", "/tmp/wd check")
    out = await ctx.run(sandbox, "pwd", workdir="/tmp/wd check")
    expect(out.stdout.strip() == "/tmp/wd check", f"pwd printed {out.stdout!r}")
    rel = await ctx.sh(sandbox, "cat marker 2>/dev/null || echo none", workdir="/tmp")
    expect(rel.code == 0, f"exit {rel.code}")
    return "ok"


# ── env ──────────────────────────────────────────────────────────────────────────────────────


@check()
async def check_env_create_persists(ctx: ConformanceContext) -> str:
    """env given at create is visible to every exec."""
    sandbox = await ctx.new_sandbox("env", env={"SBCHK_PERSIST": "kept value", "SBCHK_OTHER": "2"})
    for _ in range(2):
        out = await ctx.sh(sandbox, 'printf "%s|%s" "$SBCHK_PERSIST" "$SBCHK_OTHER"')
        expect(out.stdout == "kept value|2", f"persistent env read back as {out.stdout!r}")
    return "ok"


@check()
async def check_env_exec_scoped(ctx: ConformanceContext) -> str:
    """exec env applies to that exec only and overrides create env without changing it."""
    sandbox = await ctx.new_sandbox("envscope", env={"SBCHK_PERSIST": "base"})
    probe = 'printf "%s|%s" "$SBCHK_PERSIST" "${SBCHK_EPHEMERAL-unset}"'
    out = await ctx.sh(sandbox, probe, env={"SBCHK_EPHEMERAL": "e", "SBCHK_PERSIST": "override"})
    expect(out.stdout == "override|e", f"with exec env: {out.stdout!r}")
    out = await ctx.sh(sandbox, probe)
    expect(out.stdout == "base|unset", f"after exec env: {out.stdout!r} (exec env leaked)")
    return "ok"


# ── users ────────────────────────────────────────────────────────────────────────────────────


@check()
async def check_non_root_user_via_su(ctx: ConformanceContext) -> str:
    """Harbor's ``su -s /bin/bash user -c ...`` runs as that user, who cannot write root's files."""
    sandbox = await ctx.shared()
    await ensure_user(ctx, sandbox)
    out = await ctx.run(
        sandbox, *as_user(NON_ROOT_USER, "id -un; if touch /root/sbchk 2>/dev/null; then echo wrote; fi")
    )
    expect(out.code == 0, f"su exited {out.code}: {out.stderr[:200]}")
    lines = out.stdout.split()
    expect(lines[:1] == [NON_ROOT_USER], f"id -un printed {out.stdout!r}")
    expect("wrote" not in lines, "non-root user could write to /root")
    root = await ctx.run(sandbox, "id", "-u")
    expect(root.stdout.strip() == "0", f"default exec user id is {root.stdout.strip()!r}, expected root")
    return "ok"
