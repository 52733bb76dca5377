"""A conformance suite for implementations of the ``sky.sandbox`` surface Harbor relies on.

One contract, several implementations (SkyPilot's real SDK, the local Docker emulation in
``osmosis_harbor.sandbox.docker``): the same checks run against any of them, so one run proves they agree on what
Harbor's ``SkypilotEnvironment`` depends on. Modelled on inspect_ai's sandbox ``self_check``:
each check is a small async function that raises ``AssertionError`` with a readable message,
and the runner turns that into a structured :class:`CheckResult`.

The checks use the surface exactly the way Harbor does (``create.aio``, ``exec.aio`` then
``await handle.wait()`` then ``handle.stdout.read()``, ``write_bytes.aio``, ``read_bytes.aio``,
``terminate.aio``), plus a blocking-API check and, optionally, warm pools. The limits checks
read back the bounds a sandbox really gets (cgroup memory, pids and CPU, the size of /tmp) and
prove them with a fork bomb, a memory hog and a /tmp fill; what an implementation does not
bound is named in the ``bounds`` check's detail.

Traffic rule: no check sends network traffic anywhere; the network check inspects interfaces
and routes inside the sandbox.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from osmosis_harbor.sandbox.liveness import sandbox_state

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SEC = 180.0
NON_ROOT_USER = "sbcheck"
LARGE_FILE_BYTES = 20 * 1024 * 1024


class CheckResult(BaseModel):
    """Outcome of one check: what a CLI prints and a test asserts on."""

    name: str
    passed: bool
    detail: str
    seconds: float


@dataclass
class ExecOutcome:
    """A finished command, read the way Harbor reads it."""

    code: int | None
    stdout: str
    stderr: str
    seconds: float


async def _drain(stream: Any) -> str:
    """Harbor accepts ``read()`` returning str or bytes, sync or awaitable: so do we."""
    data = stream.read()
    if inspect.isawaitable(data):
        data = await data
    if isinstance(data, (bytes, bytearray)):
        return bytes(data).decode("utf-8", errors="replace")
    return data or ""


def _field(obj: Any, name: str) -> Any:
    """Records may be objects or mappings depending on the implementation."""
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


@dataclass
class ConformanceContext:
    """Shared state for a run: the SDK, the image, and everything created (for cleanup)."""

    sdk: Any
    image: str
    prefix: str = field(default_factory=lambda: f"sbchk-{uuid.uuid4().hex[:6]}")
    _sandboxes: list[Any] = field(default_factory=list)
    _pools: list[str] = field(default_factory=list)
    _shared: Any | None = None
    _shared_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def unique(self, stem: str) -> str:
        """A DNS-1123 name unique to this run (prefix 12 + stem + 6 hex stays under 53)."""
        return f"{self.prefix}-{stem[:28]}-{uuid.uuid4().hex[:6]}"

    async def new_sandbox(self, stem: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", 900)
        if "pool" not in kwargs:
            kwargs.setdefault("image", self.image)
        sandbox = await self.sdk.create.aio(name=self.unique(stem), **kwargs)
        self._sandboxes.append(sandbox)
        return sandbox

    async def shared(self) -> Any:
        """One long-lived sandbox for checks that do not care about isolation (fast)."""
        async with self._shared_lock:
            if self._shared is None:
                self._shared = await self.new_sandbox("shared")
            return self._shared

    def track_pool(self, name: str) -> None:
        self._pools.append(name)

    async def run(
        self,
        sandbox: Any,
        *argv: str,
        workdir: str | None = None,
        timeout: int | None = 60,
        env: dict[str, str] | None = None,
    ) -> ExecOutcome:
        started = time.monotonic()
        handle = await sandbox.exec.aio(*argv, workdir=workdir, timeout_seconds=timeout, env=env)
        code = await handle.wait()
        return ExecOutcome(
            code=code,
            stdout=await _drain(handle.stdout),
            stderr=await _drain(handle.stderr),
            seconds=time.monotonic() - started,
        )

    async def sh(self, sandbox: Any, script: str, **kwargs: Any) -> ExecOutcome:
        return await self.run(sandbox, "sh", "-c", script, **kwargs)

    async def close(self) -> None:
        """Best effort: a failing cleanup must not hide the check results."""
        for sandbox in self._sandboxes:
            try:
                await sandbox.terminate.aio(wait=True)
            except Exception as exc:  # noqa: BLE001 - cleanup is best effort
                log.warning("conformance cleanup: terminate %s failed: %s", getattr(sandbox, "name", "?"), exc)
        for pool in self._pools:
            try:
                await self.sdk.delete_pool.aio(pool)
            except Exception as exc:  # noqa: BLE001 - a check may already have deleted it
                log.debug("conformance cleanup: delete_pool %s: %s", pool, exc)
        self._sandboxes.clear()
        self._pools.clear()
        self._shared = None


CheckFn = Callable[[ConformanceContext], Awaitable[str]]


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn
    pools: bool = False

    @property
    def description(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


CHECKS: list[Check] = []


def check(*, pools: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register a check; its function name (minus ``check_``) is the check's name."""

    def register(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(name=fn.__name__.removeprefix("check_"), fn=fn, pools=pools))
        return fn

    return register


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


async def _expect_raises(awaitable: Awaitable[Any], what: str) -> BaseException:
    try:
        await awaitable
    except Exception as exc:  # noqa: BLE001 - the class is what we report
        return exc
    raise AssertionError(f"{what}: expected an exception, none raised")


async def _poll(predicate: Callable[[], Awaitable[bool]], *, timeout: float, what: str) -> float:
    """Wait for *predicate* with a deadline; returns the seconds it took."""
    started = time.monotonic()
    delay = 0.05
    while not await predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not true after {timeout:.0f}s")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    return time.monotonic() - started


# ── exec ─────────────────────────────────────────────────────────────────────────────────────


@check()
async def check_exec_stdout_and_exit_code(ctx: ConformanceContext) -> str:
    """stdout is returned and the command's exit code is reported."""
    out = await ctx.sh(await ctx.shared(), "echo hello; exit 3")
    _expect(out.stdout == "hello\n", f"stdout {out.stdout!r} != 'hello\\n'")
    _expect(out.code == 3, f"exit code {out.code} != 3")
    return f"exec round trip {out.seconds * 1000:.0f} ms"


@check()
async def check_exec_stderr_is_separate(ctx: ConformanceContext) -> str:
    """stderr is captured separately from stdout."""
    out = await ctx.sh(await ctx.shared(), "echo to-out; echo to-err >&2")
    _expect(out.stdout == "to-out\n", f"stdout {out.stdout!r}")
    _expect(out.stderr == "to-err\n", f"stderr {out.stderr!r}")
    return "ok"


@check()
async def check_exec_exit_codes(ctx: ConformanceContext) -> str:
    """true/false/explicit codes map exactly; a missing binary is a non-zero exit or an error."""
    sandbox = await ctx.shared()
    for argv, want in ((["true"], 0), (["false"], 1), (["sh", "-c", "exit 42"], 42)):
        got = (await ctx.run(sandbox, *argv)).code
        _expect(got == want, f"{argv} exited {got}, expected {want}")
    try:
        missing = (await ctx.run(sandbox, "/no/such/binary-xyz")).code
    except Exception as exc:  # noqa: BLE001 - an implementation may refuse to start it
        return f"missing binary raised {type(exc).__name__}"
    _expect(missing not in (0, None), f"missing binary exited {missing}")
    return f"missing binary exit code {missing}"


@check()
async def check_exec_no_implicit_shell(ctx: ConformanceContext) -> str:
    """argv is not re-interpreted by a shell: no expansion, globbing or command separators."""
    words = ["$HOME", "a;b", "*", "`id`", "$(id)", "x|y", "&&"]
    out = await ctx.run(await ctx.shared(), "echo", *words)
    _expect(out.stdout == " ".join(words) + "\n", f"echo printed {out.stdout!r}")
    return "metacharacters passed literally"


@check()
async def check_exec_argv_preserved(ctx: ConformanceContext) -> str:
    """Spaces, quotes, newlines, unicode and empty arguments survive as separate argv items."""
    args = ["a b", "it's", '"dq"', "line1\nline2", "ünï😀", "", "--flag=x y"]
    out = await ctx.run(await ctx.shared(), "printf", "[%s]", *args)
    want = "".join(f"[{a}]" for a in args)
    _expect(out.stdout == want, f"printf printed {out.stdout!r}, expected {want!r}")
    return "ok"


@check()
async def check_exec_timeout_kills_process_group(ctx: ConformanceContext) -> str:
    """A timed-out command returns promptly with a non-zero code and its children die too."""
    sandbox = await ctx.shared()
    marker = str(4000 + int(uuid.uuid4().hex[:3], 16) % 999)
    script = f"sleep {marker} & sleep {int(marker) + 1}; echo finished"
    out = await ctx.sh(sandbox, script, timeout=2)
    _expect(out.code not in (0, None), f"timed-out command exited {out.code}")
    _expect("finished" not in out.stdout, "command ran to completion despite the timeout")
    _expect(out.seconds < 15, f"wait() returned after {out.seconds:.1f}s for a 2s timeout")

    async def no_leftovers() -> bool:
        scan = await ctx.sh(sandbox, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
        return f"sleep {marker}" not in scan.stdout and f"sleep {int(marker) + 1}" not in scan.stdout

    await _poll(no_leftovers, timeout=10, what="background child of the timed-out command still running")
    return f"exit code {out.code} after {out.seconds:.1f}s"


@check()
async def check_exec_large_output(ctx: ConformanceContext) -> str:
    """Megabytes of stdout arrive intact."""
    out = await ctx.sh(await ctx.shared(), "head -c 2097152 /dev/zero | tr '\\0' 'x'")
    _expect(out.code == 0, f"exit {out.code}: {out.stderr[:200]}")
    _expect(out.stdout == "x" * 2097152, f"got {len(out.stdout)} chars, expected 2097152 'x'")
    return f"2 MiB in {out.seconds:.2f}s"


@check()
async def check_exec_concurrent(ctx: ConformanceContext) -> str:
    """Several commands in one sandbox run in parallel, not one after another."""
    sandbox = await ctx.shared()
    started = time.monotonic()
    outs = await asyncio.gather(*(ctx.run(sandbox, "sleep", "1") for _ in range(4)))
    elapsed = time.monotonic() - started
    _expect(all(o.code == 0 for o in outs), f"exit codes {[o.code for o in outs]}")
    _expect(elapsed < 3.5, f"4 parallel 1s sleeps took {elapsed:.1f}s")
    return f"4 x sleep 1 in {elapsed:.2f}s"


@check()
async def check_exec_workdir(ctx: ConformanceContext) -> str:
    """workdir sets the command's current directory."""
    sandbox = await ctx.shared()
    await ctx.run(sandbox, "mkdir", "-p", "/tmp/wd check")
    out = await ctx.run(sandbox, "pwd", workdir="/tmp/wd check")
    _expect(out.stdout.strip() == "/tmp/wd check", f"pwd printed {out.stdout!r}")
    rel = await ctx.sh(sandbox, "cat marker 2>/dev/null || echo none", workdir="/tmp")
    _expect(rel.code == 0, f"exit {rel.code}")
    return "ok"


# ── env ──────────────────────────────────────────────────────────────────────────────────────


@check()
async def check_env_create_persists(ctx: ConformanceContext) -> str:
    """env given at create is visible to every exec."""
    sandbox = await ctx.new_sandbox("env", env={"SBCHK_PERSIST": "kept value", "SBCHK_OTHER": "2"})
    for _ in range(2):
        out = await ctx.sh(sandbox, 'printf "%s|%s" "$SBCHK_PERSIST" "$SBCHK_OTHER"')
        _expect(out.stdout == "kept value|2", f"persistent env read back as {out.stdout!r}")
    return "ok"


@check()
async def check_env_exec_scoped(ctx: ConformanceContext) -> str:
    """exec env applies to that exec only and overrides create env without changing it."""
    sandbox = await ctx.new_sandbox("envscope", env={"SBCHK_PERSIST": "base"})
    probe = 'printf "%s|%s" "$SBCHK_PERSIST" "${SBCHK_EPHEMERAL-unset}"'
    out = await ctx.sh(sandbox, probe, env={"SBCHK_EPHEMERAL": "e", "SBCHK_PERSIST": "override"})
    _expect(out.stdout == "override|e", f"with exec env: {out.stdout!r}")
    out = await ctx.sh(sandbox, probe)
    _expect(out.stdout == "base|unset", f"after exec env: {out.stdout!r} (exec env leaked)")
    return "ok"


# ── users ────────────────────────────────────────────────────────────────────────────────────


async def _ensure_user(ctx: ConformanceContext, sandbox: Any) -> None:
    script = (
        f"id -u {NON_ROOT_USER} >/dev/null 2>&1 || useradd -m {NON_ROOT_USER} 2>/dev/null || "
        f"(echo '{NON_ROOT_USER}:x:4321:4321::/tmp:/bin/sh' >> /etc/passwd && "
        f"echo '{NON_ROOT_USER}:x:4321:' >> /etc/group)"
    )
    out = await ctx.sh(sandbox, script)
    _expect(out.code == 0, f"could not create user {NON_ROOT_USER}: {out.stderr[:200]}")


def _as_user(user: str, command: str) -> list[str]:
    """Exactly Harbor's argv for a non-default user (SkypilotEnvironment._exec_argv)."""
    return ["su", "-s", "/bin/bash", user, "-c", f"bash -c {shlex.quote(command)}"]


@check()
async def check_non_root_user_via_su(ctx: ConformanceContext) -> str:
    """Harbor's ``su -s /bin/bash user -c ...`` runs as that user, who cannot write root's files."""
    sandbox = await ctx.shared()
    await _ensure_user(ctx, sandbox)
    out = await ctx.run(sandbox, *_as_user(NON_ROOT_USER, "id -un; if touch /root/sbchk 2>/dev/null; then echo wrote; fi"))
    _expect(out.code == 0, f"su exited {out.code}: {out.stderr[:200]}")
    lines = out.stdout.split()
    _expect(lines[:1] == [NON_ROOT_USER], f"id -un printed {out.stdout!r}")
    _expect("wrote" not in lines, "non-root user could write to /root")
    root = await ctx.run(sandbox, "id", "-u")
    _expect(root.stdout.strip() == "0", f"default exec user id is {root.stdout.strip()!r}, expected root")
    return "ok"


# ── files ────────────────────────────────────────────────────────────────────────────────────


async def _round_trip(ctx: ConformanceContext, data: bytes, path: str) -> float:
    sandbox = await ctx.shared()
    started = time.monotonic()
    await sandbox.write_bytes.aio(data, path)
    back = bytes(await sandbox.read_bytes.aio(path))
    seconds = time.monotonic() - started
    _expect(len(back) == len(data), f"{path}: read {len(back)} bytes, wrote {len(data)}")
    _expect(back == data, f"{path}: content differs after round trip")
    return seconds


@check()
async def check_file_roundtrip_text(ctx: ConformanceContext) -> str:
    """A small UTF-8 text file reads back identical."""
    await _round_trip(ctx, "héllo\nwörld\n".encode(), "/tmp/sbchk/text.txt")
    return "ok"


@check()
async def check_file_roundtrip_binary(ctx: ConformanceContext) -> str:
    """Every byte value (NULs, CR/LF, high bytes) survives."""
    data = bytes(range(256)) * 64 + b"\x00\r\n\x00" + os.urandom(4096)
    await _round_trip(ctx, data, "/tmp/sbchk/binary.bin")
    return f"{len(data)} bytes"


@check()
async def check_file_large(ctx: ConformanceContext) -> str:
    """A 20 MiB file round-trips and matches a checksum computed inside the sandbox."""
    data = os.urandom(LARGE_FILE_BYTES)
    seconds = await _round_trip(ctx, data, "/tmp/sbchk/large.bin")
    out = await ctx.run(await ctx.shared(), "sha256sum", "/tmp/sbchk/large.bin")
    if out.code == 0:  # images without sha256sum still pass on the round trip
        _expect(out.stdout.split()[0] == hashlib.sha256(data).hexdigest(), "in-sandbox sha256 differs")
    await ctx.run(await ctx.shared(), "rm", "-f", "/tmp/sbchk/large.bin")
    return f"20 MiB write+read in {seconds:.2f}s"


@check()
async def check_file_empty(ctx: ConformanceContext) -> str:
    """An empty file is created, exists, and reads back empty."""
    await _round_trip(ctx, b"", "/tmp/sbchk/empty")
    out = await ctx.run(await ctx.shared(), "test", "-f", "/tmp/sbchk/empty")
    _expect(out.code == 0, "empty file does not exist in the sandbox")
    return "ok"


@check()
async def check_file_creates_parent_dirs(ctx: ConformanceContext) -> str:
    """write_bytes creates missing parent directories."""
    path = f"/tmp/sbchk/{uuid.uuid4().hex[:6]}/deep/er/file.txt"
    await _round_trip(ctx, b"nested", path)
    return "ok"


@check()
async def check_file_overwrite(ctx: ConformanceContext) -> str:
    """Writing an existing path replaces its content (shorter content does not keep a tail)."""
    await _round_trip(ctx, b"a long first version", "/tmp/sbchk/over.txt")
    await _round_trip(ctx, b"short", "/tmp/sbchk/over.txt")
    return "ok"


@check()
async def check_file_missing_raises(ctx: ConformanceContext) -> str:
    """Reading a missing file raises FileNotFoundError."""
    exc = await _expect_raises((await ctx.shared()).read_bytes.aio("/tmp/sbchk/does-not-exist"), "missing file")
    _expect(isinstance(exc, FileNotFoundError), f"raised {type(exc).__name__}: {exc}")
    return "FileNotFoundError"


@check()
async def check_file_directory_raises(ctx: ConformanceContext) -> str:
    """Reading a directory is an error (not an archive of its contents)."""
    exc = await _expect_raises((await ctx.shared()).read_bytes.aio("/etc"), "read of a directory")
    return type(exc).__name__


@check()
async def check_file_permissions(ctx: ConformanceContext) -> str:
    """Written files are owner-writable and world-readable, so a non-root agent can read them."""
    sandbox = await ctx.shared()
    await _ensure_user(ctx, sandbox)
    await sandbox.write_bytes.aio(b"for everyone", "/tmp/sbchk/perm/readable.txt")
    out = await ctx.run(sandbox, "stat", "-c", "%a %U", "/tmp/sbchk/perm/readable.txt")
    mode_text, _, owner = out.stdout.strip().partition(" ")
    mode = int(mode_text, 8)
    _expect(bool(mode & 0o200) and mode & 0o044 == 0o044, f"mode {mode_text} is not owner-writable/world-readable")
    read = await ctx.run(sandbox, *_as_user(NON_ROOT_USER, "cat /tmp/sbchk/perm/readable.txt"))
    _expect(read.stdout == "for everyone", f"non-root read {read.stdout!r} (exit {read.code})")
    return f"mode {mode_text}, owner {owner}"


@check()
async def check_file_visible_to_exec(ctx: ConformanceContext) -> str:
    """Files written by the API are seen by commands, and files made by commands are readable."""
    sandbox = await ctx.shared()
    await sandbox.write_bytes.aio(b"from api\n", "/tmp/sbchk/api.txt")
    out = await ctx.run(sandbox, "cat", "/tmp/sbchk/api.txt")
    _expect(out.stdout == "from api\n", f"cat printed {out.stdout!r}")
    await ctx.sh(sandbox, "printf 'from exec' > /tmp/sbchk/exec.txt")
    back = bytes(await sandbox.read_bytes.aio("/tmp/sbchk/exec.txt"))
    _expect(back == b"from exec", f"read_bytes returned {back!r}")
    return "ok"


# ── lifecycle ────────────────────────────────────────────────────────────────────────────────


async def _listed(ctx: ConformanceContext, name: str) -> Any | None:
    for record in await ctx.sdk.ls.aio():
        if _field(record, "name") == name:
            return record
    return None


@check()
async def check_ls_lists_sandbox(ctx: ConformanceContext) -> str:
    """ls() reports a live sandbox with its name."""
    sandbox = await ctx.shared()
    record = await _listed(ctx, sandbox.name)
    _expect(record is not None, f"{sandbox.name} missing from ls()")
    state = await sandbox_state(ctx.sdk, sandbox.name)
    _expect(state.live, f"ls() reports status {state.status!r} for a running sandbox (liveness.LIVE_STATUSES)")
    return f"status {_field(record, 'status')}"


@check()
async def check_lost_sandbox_is_seen(ctx: ConformanceContext) -> str:
    """A sandbox removed under a running command: the command ends, and ls() no longer calls it live.

    This is what tells a lost sandbox from a failing workflow (liveness.py)."""
    sandbox = await ctx.new_sandbox("lost")
    handle = await sandbox.exec.aio("sleep", "300", timeout_seconds=600)
    await sandbox.terminate.aio(wait=True)  # the only removal every implementation offers
    started = time.monotonic()
    try:
        code: Any = await asyncio.wait_for(handle.wait(), 30)
    except TimeoutError:
        raise AssertionError("a command kept waiting 30s after its sandbox was removed") from None
    except Exception as exc:  # noqa: BLE001 - raising is a valid way to end
        code = type(exc).__name__
    _expect(code != 0, "a command reported success although its sandbox was removed under it")
    state = await sandbox_state(ctx.sdk, sandbox.name)
    _expect(not state.live, f"ls() still reports the removed sandbox as {state.status!r}")
    return f"command ended with {code} after {time.monotonic() - started:.2f}s; ls status {state.status}"


@check()
async def check_terminate_idempotent(ctx: ConformanceContext) -> str:
    """terminate twice is fine; afterwards exec fails and ls() no longer lists the sandbox."""
    sandbox = await ctx.new_sandbox("term")
    await sandbox.terminate.aio(wait=True)
    await sandbox.terminate.aio(wait=True)
    try:
        out = await ctx.run(sandbox, "true")
        _expect(out.code not in (0, None), "exec on a terminated sandbox succeeded")
        after = f"exec exit {out.code}"
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - raising is the expected outcome
        after = f"exec raised {type(exc).__name__}"

    async def gone() -> bool:
        return await _listed(ctx, sandbox.name) is None

    await _poll(gone, timeout=30, what="terminated sandbox still listed")
    return after


@check()
async def check_duplicate_name_rejected(ctx: ConformanceContext) -> str:
    """A second live sandbox with the same name is refused."""
    sandbox = await ctx.shared()
    exc = await _expect_raises(ctx.sdk.create.aio(name=sandbox.name, image=ctx.image, timeout=60), "duplicate name")
    return type(exc).__name__


@check()
async def check_invalid_name_rejected(ctx: ConformanceContext) -> str:
    """Names that are not DNS-1123 (uppercase, underscore, > 53 chars) raise ValueError."""
    for bad in ("Upper-Case", "under_score", "x" * 54, "-leading"):
        exc = await _expect_raises(ctx.sdk.create.aio(name=bad, image=ctx.image, timeout=60), f"name {bad!r}")
        _expect(isinstance(exc, ValueError), f"name {bad!r} raised {type(exc).__name__}, expected ValueError")
    return "ok"


@check()
async def check_block_network(ctx: ConformanceContext) -> str:
    """block_network leaves no usable network (only loopback, or at least no default route)."""
    sandbox = await ctx.new_sandbox("nonet", block_network=True)
    dev = await ctx.run(sandbox, "cat", "/proc/net/dev")
    interfaces = sorted(line.split(":", 1)[0].strip() for line in dev.stdout.splitlines()[2:] if ":" in line)
    route = await ctx.run(sandbox, "cat", "/proc/net/route")
    default_routes = [ln for ln in route.stdout.splitlines()[1:] if ln.split()[1:2] == ["00000000"]]
    only_lo = interfaces == ["lo"]
    _expect(only_lo or not default_routes, f"interfaces {interfaces}, default routes {default_routes}")
    return f"interfaces {interfaces}"


@check()
async def check_default_network_has_interface(ctx: ConformanceContext) -> str:
    """Without block_network the sandbox has a non-loopback interface (it is not isolated)."""
    dev = await ctx.run(await ctx.shared(), "cat", "/proc/net/dev")
    interfaces = [line.split(":", 1)[0].strip() for line in dev.stdout.splitlines()[2:] if ":" in line]
    _expect(any(i != "lo" for i in interfaces), f"only {interfaces}")
    return f"interfaces {sorted(interfaces)}"


@check()
async def check_sync_api(ctx: ConformanceContext) -> str:
    """The blocking twins (create, exec + wait, write/read, terminate) work from a thread."""
    sdk, image, name = ctx.sdk, ctx.image, ctx.unique("sync")

    def flow() -> str:
        sandbox = sdk.create(name=name, image=image, timeout=300)
        try:
            handle = sandbox.exec("sh", "-c", "echo sync; exit 5")
            code = handle.wait()
            stdout = handle.stdout.read()
            sandbox.write_bytes(b"sync-bytes", "/tmp/sync.bin")
            data = bytes(sandbox.read_bytes("/tmp/sync.bin"))
        finally:
            sandbox.terminate(wait=True)
        _expect((code, stdout) == (5, "sync\n"), f"sync exec gave {code} {stdout!r}")
        _expect(data == b"sync-bytes", f"sync read {data!r}")
        return "ok"

    return await asyncio.to_thread(flow)


# ── limits ───────────────────────────────────────────────────────────────────────────────────

_BOUNDS_SCRIPT = r"""
cg=/sys/fs/cgroup
rd() { cat "$1" 2>/dev/null || echo none; }
if [ -f $cg/memory.max ]; then
  echo "memory $(rd $cg/memory.max)"; echo "pids $(rd $cg/pids.max)"; echo "cpu $(rd $cg/cpu.max)"
else
  echo "memory $(rd $cg/memory/memory.limit_in_bytes)"; echo "pids $(rd $cg/pids/pids.max)"
  echo "cpu $(rd $cg/cpu/cpu.cfs_quota_us) $(rd $cg/cpu/cpu.cfs_period_us)"
fi
echo "tmp $(df -Pk /tmp | tail -n 1)"
echo "root $(df -Pk / | tail -n 1)"
"""
_UNLIMITED_MEMORY = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2^63
SMALL_MEMORY_GB = 0.25  # the hog and the /tmp fill run in a sandbox this small: seconds, not minutes


class Bounds(BaseModel):
    """The limits a sandbox really has, read back from inside it (None: unbounded)."""

    memory_bytes: int | None
    pids: int | None
    cpus: float | None
    tmp_kb: int
    tmp_mount: str
    root_kb: int
    root_fs: str

    @property
    def tmp_bounded(self) -> bool:
        """/tmp is its own filesystem, smaller than the one under /."""
        return self.tmp_mount == "/tmp" and self.tmp_kb < self.root_kb

    def unbounded(self) -> list[str]:
        gone = [what for what, value in (("memory", self.memory_bytes), ("pids", self.pids), ("cpu", self.cpus))
                if value is None]
        if not self.tmp_bounded:
            gone.append("/tmp (on the same filesystem as /)")
        gone.append(f"the writable layer (/: {self.root_fs}, {_gib(self.root_kb * 1024)}; bounded only if the "
                    "engine enforces a per-sandbox quota there, which overlay2 on ext4 does not)")
        return gone

    def describe(self) -> str:
        memory = _gib(self.memory_bytes) if self.memory_bytes else "unbounded"
        return (f"memory {memory}, pids {self.pids or 'unbounded'}, cpus {self.cpus or 'unbounded'}, "
                f"/tmp {_gib(self.tmp_kb * 1024) if self.tmp_bounded else 'unbounded'}; "
                f"not bounded: {'; '.join(self.unbounded())}")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024**3:.2f} GiB"


def _int_or_none(text: str) -> int | None:
    return int(text) if text.strip().lstrip("-").isdigit() and int(text) >= 0 else None


def _parse_bounds(text: str) -> Bounds:
    lines = {k: v for k, _, v in (ln.partition(" ") for ln in text.splitlines() if ln.strip())}
    memory = _int_or_none(lines.get("memory", ""))
    cpu = lines.get("cpu", "").split()
    quota, period = (_int_or_none(cpu[0]), _int_or_none(cpu[1])) if len(cpu) == 2 else (None, None)
    tmp, root = lines.get("tmp", "").split(), lines.get("root", "").split()
    _expect(len(tmp) == 6 and len(root) == 6, f"could not read df output: {text!r}")
    return Bounds(
        memory_bytes=memory if memory is not None and memory < _UNLIMITED_MEMORY else None,
        pids=_int_or_none(lines.get("pids", "")),
        cpus=round(quota / period, 2) if quota and period else None,
        tmp_kb=int(tmp[1]), tmp_mount=tmp[5], root_kb=int(root[1]), root_fs=root[0],
    )


async def read_bounds(ctx: ConformanceContext, sandbox: Any) -> Bounds:
    out = await ctx.sh(sandbox, _BOUNDS_SCRIPT)
    _expect(out.code == 0, f"reading the bounds failed (exit {out.code}): {out.stderr[:200]}")
    return _parse_bounds(out.stdout)


@check()
async def check_bounds(ctx: ConformanceContext) -> str:
    """A sandbox created without resources still has memory, pid and CPU bounds (read back)."""
    bounds = await read_bounds(ctx, await ctx.shared())
    missing = [what for what, value in (("memory", bounds.memory_bytes), ("pids", bounds.pids),
                                        ("cpu", bounds.cpus)) if value is None]
    _expect(not missing, f"no {', '.join(missing)} limit: {bounds.describe()}")
    return bounds.describe()


@check()
async def check_pid_limit_contains_fork_bomb(ctx: ConformanceContext) -> str:
    """A fork bomb stops at the pid limit (and the sandbox is discarded after)."""
    sandbox = await ctx.new_sandbox("pids")
    pids = (await read_bounds(ctx, sandbox)).pids
    _expect(pids is not None, "no pid limit (pids.max is 'max'): a fork bomb would fill the node's pid table")
    assert pids is not None
    bomb = f"n=0; while [ $n -lt {pids + 64} ]; do sleep 60 </dev/null >/dev/null 2>&1 & n=$((n+1)); echo $n; done"
    try:
        out = await ctx.sh(sandbox, bomb, timeout=120)
    finally:
        await sandbox.terminate.aio(wait=True)
    counts = [int(line) for line in out.stdout.split() if line.isdigit()]
    spawned = counts[-1] if counts else 0
    _expect(out.code != 0 and spawned < pids, f"spawned {spawned} processes (exit {out.code}), pids.max {pids}")
    return f"fork bomb stopped after {spawned} processes (pids.max {pids}) in {out.seconds:.1f}s"


@check()
async def check_memory_limit_kills_hog(ctx: ConformanceContext) -> str:
    """A process allocating past the memory limit is killed; the sandbox itself survives."""
    sandbox = await ctx.new_sandbox("mem", memory_gb=SMALL_MEMORY_GB)
    limit = (await read_bounds(ctx, sandbox)).memory_bytes
    _expect(limit is not None, f"memory_gb={SMALL_MEMORY_GB} gave no memory limit inside the sandbox")
    hog = await ctx.sh(sandbox, "tail /dev/zero", timeout=120)  # buffers a line that never ends
    _expect(hog.code not in (0, None, 124), f"the memory hog exited {hog.code} (expected a kill, 137)")
    alive = await ctx.run(sandbox, "true")
    _expect(alive.code == 0, f"the sandbox did not survive the OOM kill of one process (exit {alive.code})")
    return f"hog killed (exit {hog.code}) at the {_gib(limit)} limit in {hog.seconds:.1f}s; sandbox still runs"


@check()
async def check_tmp_bound_refuses_writes(ctx: ConformanceContext) -> str:
    """Writing past the /tmp bound fails with 'No space left' instead of filling the host disk."""
    sandbox = await ctx.new_sandbox("tmpfill", memory_gb=SMALL_MEMORY_GB)
    bounds = await read_bounds(ctx, sandbox)
    _expect(bounds.tmp_bounded, f"/tmp is not bounded ({bounds.tmp_mount} on {bounds.root_fs}): {bounds.describe()}")
    size = bounds.tmp_kb * 1024
    fill = await ctx.sh(sandbox, f"head -c {size + (1 << 20)} /dev/zero > /tmp/sbchk-fill", timeout=120)
    await ctx.run(sandbox, "rm", "-f", "/tmp/sbchk-fill")
    _expect(fill.code != 0 and "No space left" in fill.stderr,
            f"writing {_gib(size + (1 << 20))} into a {_gib(size)} /tmp: exit {fill.code}, {fill.stderr[:200]!r}")
    return f"/tmp {_gib(size)}: the write past it failed with ENOSPC in {fill.seconds:.1f}s"


# ── pools ────────────────────────────────────────────────────────────────────────────────────


async def _pool_counts(ctx: ConformanceContext, pool: str) -> tuple[int, int]:
    info = await ctx.sdk.get_pool.aio(pool)
    return int(_field(info, "idle")), int(_field(info, "claimed"))


@check(pools=True)
async def check_pool_claim_and_refill(ctx: ConformanceContext) -> str:
    """A pool claim is fast, gets the create env, and the pool refills to its size."""
    pool = ctx.unique("pool")
    ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    _expect((await _pool_counts(ctx, pool))[0] >= 1, "create_pool returned before a member was idle")
    exc = await _expect_raises(
        ctx.sdk.create.aio(name=ctx.unique("bad"), pool=pool, image=ctx.image, timeout=60), "image with pool"
    )
    _expect(isinstance(exc, ValueError), f"image with pool raised {type(exc).__name__}, expected ValueError")
    started = time.monotonic()
    sandbox = await ctx.new_sandbox("claim", pool=pool, env={"SBCHK_POOL": "claimed"})
    out = await ctx.sh(sandbox, 'printf %s "$SBCHK_POOL"')
    claim_seconds = time.monotonic() - started
    _expect(out.stdout == "claimed", f"claimed sandbox env {out.stdout!r}")

    async def refilled() -> bool:
        idle, claimed = await _pool_counts(ctx, pool)
        return idle >= 1 and claimed >= 1

    refill_seconds = await _poll(refilled, timeout=90, what="pool did not refill after a claim")
    return f"claim+first exec {claim_seconds:.2f}s, refill {refill_seconds:.2f}s"


@check(pools=True)
async def check_pool_resize(ctx: ConformanceContext) -> str:
    """set_pool_size grows and shrinks the idle members; delete_pool removes them."""
    pool = ctx.unique("resize")
    ctx.track_pool(pool)
    await ctx.sdk.create_pool.aio(pool, ctx.image, replicas=1)
    await ctx.sdk.set_pool_size.aio(pool, 2)

    async def idle_is(n: int) -> bool:
        return (await _pool_counts(ctx, pool))[0] == n

    await _poll(lambda: idle_is(2), timeout=90, what="pool did not grow to 2")
    await ctx.sdk.set_pool_size.aio(pool, 0)
    await _poll(lambda: idle_is(0), timeout=60, what="pool did not shrink to 0")
    await ctx.sdk.delete_pool.aio(pool)
    return "1 -> 2 -> 0, deleted"


# ── runner ───────────────────────────────────────────────────────────────────────────────────


def selected_checks(*, include_pools: bool = True, only: Sequence[str] | None = None) -> list[Check]:
    chosen = [c for c in CHECKS if include_pools or not c.pools]
    if only is not None:
        unknown = set(only) - {c.name for c in CHECKS}
        if unknown:
            raise ValueError(f"unknown checks: {sorted(unknown)}")
        chosen = [c for c in chosen if c.name in only]
    return chosen


def get_check(name: str) -> Check:
    for item in CHECKS:
        if item.name == name:
            return item
    raise KeyError(name)


async def run_check(item: Check, ctx: ConformanceContext, *, timeout: float = CHECK_TIMEOUT_SEC) -> CheckResult:
    """Run one check; failures and errors become a result, never an exception."""
    started = time.monotonic()
    try:
        detail = await asyncio.wait_for(item.fn(ctx), timeout)
        passed = True
    except AssertionError as exc:
        passed, detail = False, str(exc) or "assertion failed"
    except TimeoutError:
        passed, detail = False, f"timed out after {timeout:.0f}s"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        passed, detail = False, f"{type(exc).__name__}: {exc}"
    return CheckResult(name=item.name, passed=passed, detail=detail, seconds=round(time.monotonic() - started, 3))


async def run_conformance(
    sdk: Any,
    image: str,
    *,
    include_pools: bool = True,
    only: Sequence[str] | None = None,
) -> list[CheckResult]:
    """Run the suite against *sdk* (an object with the ``sky.sandbox`` surface) on *image*."""
    ctx = ConformanceContext(sdk=sdk, image=image)
    try:
        return [await run_check(item, ctx) for item in selected_checks(include_pools=include_pools, only=only)]
    finally:
        await ctx.close()
