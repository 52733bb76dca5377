"""Checks of the archive capability (``put_archive`` / ``get_archive``), for SDKs that offer it.

The environment moves whole trees through these two calls whenever a sandbox handle offers
them (``protocol.ArchiveSandbox``), so an SDK that offers them must get trees right: contents
and modes both ways, empty directories kept, and links that leave the tree returned as links
(never followed, so the target's bytes never travel) for the host-side extraction to judge.
What comes back is read in memory only, member by member: nothing from the sandbox is
extracted onto this machine here.
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from typing import Any

from osmosis_harbor.sandbox.conformance.core import ConformanceContext, check, expect

__all__: list[str] = []

ARCHIVES = ("archives",)


def _tar(entries: dict[str, bytes | None], *, modes: dict[str, int] | None = None) -> bytes:
    """A tar of ``entries`` (name -> content; None for a directory)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), (modes or {}).get(name, 0o644)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        return {m.name.rstrip("/"): m for m in tar.getmembers()}


def _content(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        member = tar.getmember(name)
        reader = tar.extractfile(member)
        expect(reader is not None, f"{name} is not a regular file in the archive")
        assert reader is not None
        return reader.read()


async def _fresh_dir(ctx: ConformanceContext, sandbox: Any) -> str:
    path = f"/tmp/sbchk/arc-{uuid.uuid4().hex[:8]}"
    out = await ctx.run(sandbox, "mkdir", "-p", path)
    expect(out.code == 0, f"mkdir {path}: {out.stderr[:200]}")
    return path


@check(needs=ARCHIVES)
async def check_archive_round_trip(ctx: ConformanceContext) -> str:
    """A tree put with put_archive is seen by commands and comes back identical from get_archive."""
    sandbox = await ctx.shared()
    base = await _fresh_dir(ctx, sandbox)
    binary = bytes(range(256)) * 16 + os.urandom(1024)
    entries: dict[str, bytes | None] = {
        "tree": None,
        "tree/sub": None,
        "tree/sub/data.bin": binary,
        "tree/run.sh": b"#!/bin/sh\necho ran\n",
    }
    await sandbox.put_archive.aio(_tar(entries, modes={"tree/run.sh": 0o755}), base)
    ran = await ctx.run(sandbox, f"{base}/tree/run.sh")
    expect(ran.code == 0 and ran.stdout == "ran\n", f"the uploaded script ran with {ran.code}: {ran.stdout!r}")
    data = bytes(await sandbox.get_archive.aio(f"{base}/tree"))
    members = _members(data)
    expect(set(members) >= {"tree", "tree/sub", "tree/sub/data.bin", "tree/run.sh"}, f"members {sorted(members)}")
    expect(_content(data, members["tree/sub/data.bin"].name) == binary, "data.bin differs after the round trip")
    expect(members["tree/run.sh"].mode & 0o111 == 0o111, f"run.sh came back mode {members['tree/run.sh'].mode:o}")
    return f"{len(members)} members, {len(data)} bytes back"


@check(needs=ARCHIVES)
async def check_archive_links_leaving_the_tree(ctx: ConformanceContext) -> str:
    """get_archive returns links that leave the tree as links: never followed, no target bytes."""
    sandbox = await ctx.shared()
    base = await _fresh_dir(ctx, sandbox)
    secret = f"outside-{uuid.uuid4().hex}"
    script = (
        f"mkdir -p {base}/outside {base}/tree && printf {secret} > {base}/outside/secret"
        f" && ln -s {base}/outside/secret {base}/tree/absolute"
        f" && ln -s ../outside/secret {base}/tree/relative"
        f" && ln -s ../outside {base}/tree/dirlink"
    )
    made = await ctx.sh(sandbox, script)
    expect(made.code == 0, f"making the links failed: {made.stderr[:200]}")
    followed = await ctx.run(sandbox, "cat", f"{base}/tree/relative")
    expect(followed.stdout == secret, "the links do not reach the outside file: the check would prove nothing")
    data = bytes(await sandbox.get_archive.aio(f"{base}/tree"))
    members = _members(data)
    for name, target in (
        ("tree/absolute", f"{base}/outside/secret"),
        ("tree/relative", "../outside/secret"),
        ("tree/dirlink", "../outside"),
    ):
        member = members.get(name)
        expect(member is not None, f"{name} is missing from the archive ({sorted(members)})")
        assert member is not None
        expect(member.issym(), f"{name} came back as a {member.type!r} member, not a symlink (it was followed)")
        expect(member.linkname == target, f"{name} points at {member.linkname!r}, not {target!r}")
    expect(secret.encode() not in data, "the archive carries the bytes of a file outside the tree")
    return "3 links kept as links"


@check(needs=ARCHIVES)
async def check_archive_empty_directories(ctx: ConformanceContext) -> str:
    """Empty directories survive both ways: put_archive makes them, get_archive returns them."""
    sandbox = await ctx.shared()
    base = await _fresh_dir(ctx, sandbox)
    await sandbox.put_archive.aio(
        _tar({"tree": None, "tree/empty": None, "tree/full": None, "tree/full/f": b"x"}), base
    )
    listed = await ctx.run(sandbox, "find", f"{base}/tree", "-type", "d", "-empty")
    expect(listed.stdout.split() == [f"{base}/tree/empty"], f"empty dirs in the sandbox: {listed.stdout!r}")
    made = await ctx.run(sandbox, "mkdir", "-p", f"{base}/tree/made/empty-too")
    expect(made.code == 0, f"mkdir failed: {made.stderr[:200]}")
    members = _members(bytes(await sandbox.get_archive.aio(f"{base}/tree")))
    for name in ("tree/empty", "tree/made", "tree/made/empty-too"):
        expect(name in members and members[name].isdir(), f"{name} missing or not a directory: {sorted(members)}")
    return "empty dirs kept both ways"
