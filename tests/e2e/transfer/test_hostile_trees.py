"""What a hostile sandbox sends back, end to end through a real Docker sandbox and
``SandboxEnvironment``, with and without the archive capability: a tree planted as root
arrives sanitized, ordinary hardlinks and unicode names arrive intact, and 1 GB of logs or
512 MB of stdout leave host memory nearly where it was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from osmosis_harbor.errors import TransferLimitError
from osmosis_harbor.sandbox import SandboxEnvironment
from tests.support.common import started_environment
from tests.unit.sandbox.test_extract import inventory, make_canary

MIB = 1024 * 1024


@pytest.fixture(params=["archive", "harbor"])
async def env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SandboxEnvironment]:
    """A started sandbox environment; ``archive``: the default route (archives made of the SDK's
    own calls); ``harbor``: archives off, so Harbor's own sandbox-side commands run."""
    if request.param == "harbor":
        monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    async with started_environment(tmp_path, "hostile") as environment:
        yield environment


async def sh(env: SandboxEnvironment, command: str) -> str:
    result = await env.exec(f"set -e; {command}", user="root")
    assert result.return_code == 0, result.stderr
    return result.stdout or ""


async def test_a_hostile_log_tree_arrives_sanitized(env: SandboxEnvironment, tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    up = "../" * 12 + str(canary.path).lstrip("/")
    await sh(
        env,
        "A=/logs/agent; mkdir -p $A/logs/agent; "
        "mknod $A/logs/agent/L0 b 254 0 && ln $A/logs/agent/L0 $A/x-disk; "
        "mknod $A/x-null c 1 3; mkfifo $A/logs/agent/L1 && ln $A/logs/agent/L1 $A/sample.json; "
        f"ln -s {canary.path} $A/x-abs; ln -s {up} $A/x-up; ln -s / $A/x-root; "
        "printf '#!/bin/sh\\n' > $A/suid && chmod 4755 $A/suid; echo g > $A/sgid && chmod 2666 $A/sgid; "
        "echo same > $A/aaa.txt && ln $A/aaa.txt $A/bbb.txt; echo cv > $A/r\u00e9sum\u00e9.txt; "
        "ln -s aaa.txt $A/inside",
    )
    listing = await sh(env, "find /logs/agent -printf '%y %p\\n' | sort")
    assert "b /logs/agent/logs/agent/L0" in listing and "p /logs/agent/logs/agent/L1" in listing  # really planted
    target = tmp_path / "trial-agent"
    await env.download_dir("/logs/agent", target)
    assert inventory(target) == {
        "aaa.txt": "file 644",
        "bbb.txt": "file 644",
        "inside": "link -> aaa.txt",
        "logs": "dir 755",
        "logs/agent": "dir 755",
        "r\u00e9sum\u00e9.txt": "file 644",
        "sgid": "file 644",
        "suid": "file 755",
    }
    assert (target / "bbb.txt").read_text() == "same\n" and (target / "r\u00e9sum\u00e9.txt").read_text() == "cv\n"
    canary.assert_untouched()
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["canary.txt"]


async def test_workdir_hardlinks_and_unicode_names_arrive_where_they_belong(
    env: SandboxEnvironment, tmp_path: Path
) -> None:
    await sh(
        env,
        "mkdir -p /work/app/src && echo x > /work/app/src/a.py && ln /work/app/src/a.py /work/app/b.py; echo cv > /work/app/r\u00e9sum\u00e9.txt",
    )
    back = tmp_path / "grader-copy"
    await env.download_dir("/work/app", back)
    assert inventory(back) == {
        "b.py": "file 644",
        "r\u00e9sum\u00e9.txt": "file 644",
        "src": "dir 755",
        "src/a.py": "file 644",
    }
    assert (back / "b.py").read_text() == "x\n"
    await env.upload_dir(back, "/work/grader")
    assert (
        await sh(env, "cat /work/grader/b.py /work/grader/src/a.py /work/grader/r\u00e9sum\u00e9.txt") == "x\nx\ncv\n"
    )


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith(f"{field}:"))
    return kib * 1024


def _rss_with_peak_reset() -> int:
    """This process's resident size now, with its peak (``VmHWM``) reset to it: what follows is
    measured from here, not from the highest point of whatever ran earlier in this process
    (``ru_maxrss`` is the whole process lifetime's peak, so an earlier test that peaked higher
    counted as growth here)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset the peak resident set size (Linux >= 4.0)
    return _status_bytes("VmRSS")


def _peak() -> int:
    """The highest resident size since the last :func:`_rss_with_peak_reset`."""
    return _status_bytes("VmHWM")


async def test_a_gigabyte_of_logs_is_refused_without_growing_host_memory(
    env: SandboxEnvironment, tmp_path: Path
) -> None:
    # Sparse files: a gigabyte every transfer route reads and sends in full (neither archives
    # sparsely), without the seconds of writing it to the sandbox's disk first.
    await sh(env, "mkdir -p /logs/agent && for i in $(seq 1 20); do truncate -s 52428800 /logs/agent/f$i; done")
    assert int((await sh(env, "du -sb /logs/agent")).split()[0]) >= 1000 * MIB  # the flood is really there
    before = _rss_with_peak_reset()
    with pytest.raises(TransferLimitError, match=r"sandbox output /logs(/agent)?: .* over the bound"):
        await env.download_dir("/logs/agent", tmp_path / "agent")
    assert _peak() - before < 256 * MIB
    target = tmp_path / "agent"
    written = sum(p.stat().st_size for p in target.rglob("*") if p.is_file()) if target.exists() else 0
    assert written <= 256 * MIB


async def test_half_a_gigabyte_of_stdout_keeps_only_its_tail(env: SandboxEnvironment) -> None:
    before = _rss_with_peak_reset()
    result = await env.exec("head -c 536870912 /dev/zero | tr '\\0' x; echo; echo the-end")
    assert result.return_code == 0
    out = result.stdout or ""
    kept = 4 * MIB
    assert out.startswith(f"[osmosis-harbor: the first {512 * MIB + 9 - kept} bytes of stdout were dropped")
    assert out.endswith("xx\nthe-end\n") and len(out) < kept + 200
    assert _peak() - before < 64 * MIB


async def test_filtered_downloads_are_extracted_by_us(env: SandboxEnvironment, tmp_path: Path) -> None:
    """Harbor's include/exclude downloads keep their sandbox commands, and their archives
    reach the host through our extractor: a hardlink to a FIFO arrives as nothing."""
    await sh(
        env,
        "A=/logs/agent; mkdir -p $A/keep; echo k > $A/keep/a.log; echo s > $A/skip.txt; "
        "mkfifo $A/keep/fifo && ln $A/keep/fifo $A/keep/b.log; ln $A/keep/a.log $A/keep/c.log",
    )
    filtered = tmp_path / "filtered"
    await env.download_dir_filtered(source_dir="/logs/agent", target_dir=filtered, include=["keep/*"])
    assert inventory(filtered) == {"keep": "dir 755", "keep/a.log": "file 644", "keep/c.log": "file 644"}
    excluded = tmp_path / "excluded"
    await env.download_dir_with_exclusions(source_dir="/logs/agent", target_dir=excluded, exclude=["*.txt"])
    assert inventory(excluded) == {"keep": "dir 755", "keep/a.log": "file 644", "keep/c.log": "file 644"}
    assert (excluded / "keep" / "c.log").read_text() == "k\n"
