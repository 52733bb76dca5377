"""Checks of file transfer: round trips (text, binary, large, empty), errors, permissions."""

from __future__ import annotations

import hashlib
import os
import time
import uuid

from osmosis_harbor.sandbox.conformance.core import (
    LARGE_FILE_BYTES,
    NON_ROOT_USER,
    ConformanceContext,
    as_user,
    check,
    ensure_user,
    expect,
    expect_raises,
)
from osmosis_harbor.sandbox.sdk.errors import is_api_fault, is_missing, meaning

# ── files ────────────────────────────────────────────────────────────────────────────────────


async def _round_trip(ctx: ConformanceContext, data: bytes, path: str) -> float:
    sandbox = await ctx.shared()
    started = time.monotonic()
    await sandbox.write_bytes.aio(data, path)
    back = bytes(await sandbox.read_bytes.aio(path))
    seconds = time.monotonic() - started
    expect(len(back) == len(data), f"{path}: read {len(back)} bytes, wrote {len(data)}")
    expect(back == data, f"{path}: content differs after round trip")
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
        expect(out.stdout.split()[0] == hashlib.sha256(data).hexdigest(), "in-sandbox sha256 differs")
    await ctx.run(await ctx.shared(), "rm", "-f", "/tmp/sbchk/large.bin")
    return f"20 MiB write+read in {seconds:.2f}s"


@check()
async def check_file_empty(ctx: ConformanceContext) -> str:
    """An empty file is created, exists, and reads back empty."""
    await _round_trip(ctx, b"", "/tmp/sbchk/empty")
    out = await ctx.run(await ctx.shared(), "test", "-f", "/tmp/sbchk/empty")
    expect(out.code == 0, "empty file does not exist in the sandbox")
    return "ok"


@check()
async def check_file_in_a_made_directory(ctx: ConformanceContext) -> str:
    """A file written into a directory a command just made (``mkdir -p``, as SkyPilot's examples do)."""
    directory = f"/tmp/sbchk/{uuid.uuid4().hex[:6]}/deep/er"
    made = await ctx.run(await ctx.shared(), "mkdir", "-p", directory)
    expect(made.code == 0, f"mkdir -p exited {made.code}")
    await _round_trip(ctx, b"nested", f"{directory}/file.txt")
    return "ok"


@check()
async def check_file_overwrite(ctx: ConformanceContext) -> str:
    """Writing an existing path replaces its content (shorter content does not keep a tail)."""
    await _round_trip(ctx, b"a long first version", "/tmp/sbchk/over.txt")
    await _round_trip(ctx, b"short", "/tmp/sbchk/over.txt")
    return "ok"


@check()
async def check_file_missing_raises(ctx: ConformanceContext) -> str:
    """Reading a missing file raises an error read as "not found" (``sdk/errors.py``)."""
    exc = await expect_raises((await ctx.shared()).read_bytes.aio("/tmp/sbchk/does-not-exist"), "missing file")
    expect(is_missing(exc), f"raised {type(exc).__name__}, read as {meaning(exc)}: {exc}")
    return type(exc).__name__


@check()
async def check_file_directory_raises(ctx: ConformanceContext) -> str:
    """Reading a directory is an error (not an archive of its contents), and not an API fault."""
    exc = await expect_raises((await ctx.shared()).read_bytes.aio("/etc"), "read of a directory")
    expect(not is_api_fault(exc), f"raised {type(exc).__name__}, read as an API fault (it would be retried)")
    return type(exc).__name__


@check()
async def check_file_permissions(ctx: ConformanceContext) -> str:
    """Written files are owner-writable and world-readable, so a non-root agent can read them."""
    sandbox = await ctx.shared()
    await ensure_user(ctx, sandbox)
    await sandbox.write_bytes.aio(b"for everyone", "/tmp/sbchk/perm/readable.txt")
    out = await ctx.run(sandbox, "stat", "-c", "%a %U", "/tmp/sbchk/perm/readable.txt")
    mode_text, _, owner = out.stdout.strip().partition(" ")
    mode = int(mode_text, 8)
    expect(bool(mode & 0o200) and mode & 0o044 == 0o044, f"mode {mode_text} is not owner-writable/world-readable")
    read = await ctx.run(sandbox, *as_user(NON_ROOT_USER, "cat /tmp/sbchk/perm/readable.txt"))
    expect(read.stdout == "for everyone", f"non-root read {read.stdout!r} (exit {read.code})")
    return f"mode {mode_text}, owner {owner}"


@check()
async def check_file_visible_to_exec(ctx: ConformanceContext) -> str:
    """Files written by the API are seen by commands, and files made by commands are readable."""
    sandbox = await ctx.shared()
    await sandbox.write_bytes.aio(b"from api\n", "/tmp/sbchk/api.txt")
    out = await ctx.run(sandbox, "cat", "/tmp/sbchk/api.txt")
    expect(out.stdout == "from api\n", f"cat printed {out.stdout!r}")
    await ctx.sh(sandbox, "printf 'from exec' > /tmp/sbchk/exec.txt")
    back = bytes(await sandbox.read_bytes.aio("/tmp/sbchk/exec.txt"))
    expect(back == b"from exec", f"read_bytes returned {back!r}")
    return "ok"
