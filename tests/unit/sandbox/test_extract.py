"""Our extractor (``sandbox/extract``) on crafted tars: every trick a root-in-the-sandbox
policy can put in an archive arrives sanitized, host canaries outside the target keep their
content, mode and mtime, and ordinary trees (hardlinks, unicode names) arrive intact."""

from __future__ import annotations

import io
import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.errors import OsmosisHarborError, TransferLimitError, UnreadableArchiveError
from osmosis_harbor.sandbox.transfer.extract import ExtractResult, TransferLimits, extract_archive, write_file

CANARY_TEXT = b"host canary\n"
CANARY_MTIME = 1_000_000_000


@dataclass
class Canary:
    path: Path

    def assert_untouched(self) -> None:
        st = os.lstat(self.path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_mtime == CANARY_MTIME and self.path.read_bytes() == CANARY_TEXT
        assert stat.S_IMODE(os.lstat(self.path.parent).st_mode) == 0o700


def make_canary(tmp_path: Path) -> Canary:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    outside.chmod(0o700)
    path = outside / "canary.txt"
    path.write_bytes(CANARY_TEXT)
    path.chmod(0o600)
    os.utime(path, (CANARY_MTIME, CANARY_MTIME))
    return Canary(path)


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Canary]:
    """A host file outside the target, checked unchanged (content, mode, mtime) after the test."""
    found = make_canary(tmp_path)
    yield found
    found.assert_untouched()


def member(
    name: str,
    kind: bytes = tarfile.REGTYPE,
    *,
    data: bytes = b"",
    link: str = "",
    mode: int = 0o644,
    pax: dict[str, str] | None = None,
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = kind, link, mode, 1_700_000_000
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    if pax:
        info.pax_headers = dict(pax)
    return info, data


def tar(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    out.seek(0)
    return out


def extract(archive: io.BytesIO, target: Path, **kwargs: object) -> ExtractResult:
    kwargs.setdefault("limits", TransferLimits.of(settings.current()))
    return extract_archive(archive, target, transfer="/logs/agent", **kwargs)  # type: ignore[arg-type]


def inventory(root: Path) -> dict[str, str]:
    """Every entry under root: 'file <mode>', 'dir <mode>' or 'link -> target' (nothing else may exist)."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        name = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            found[name] = f"link -> {os.readlink(path)}"
        elif stat.S_ISDIR(st.st_mode):
            found[name] = f"dir {stat.S_IMODE(st.st_mode):o}"
        else:
            assert stat.S_ISREG(st.st_mode), f"special file {name} arrived"
            found[name] = f"file {stat.S_IMODE(st.st_mode):o}"
    return found


# ── the hardlink trick ───────────────────────────────────────────────


def _trick(canary: Canary) -> io.BytesIO:
    """What the old subtree re-pack produced from a hostile /logs: members rebased to ``./``
    but hardlink targets left as ``logs/agent/...``, matching nested members the workflow made."""
    return tar(
        member("./logs/agent/L0", tarfile.FIFOTYPE),
        member("./logs/agent/L1", tarfile.SYMTYPE, link=str(canary.path)),
        member("./x-fifo", tarfile.LNKTYPE, link="logs/agent/L0"),
        member("./x-abs", tarfile.LNKTYPE, link="logs/agent/L1"),
    )


def test_positive_control_pythons_tarfile_is_fooled_by_the_hardlink_trick(tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    with tarfile.open(fileobj=_trick(canary)) as archive:
        for info in archive:
            try:
                archive.extract(info, target, filter="data")
            except tarfile.FilterError:
                pass
    planted = target / "x-fifo"
    if not (planted.exists() and stat.S_ISFIFO(os.lstat(planted).st_mode)):
        pytest.skip("this Python's tarfile has the 2025 fixes (CVE-2025-4330): the data filter held")
    # the FIFO refused at its own place arrived at the link's, and the link to the host file
    # refused at its place was followed at the other's: the canary's mode and mtime changed
    with pytest.raises(AssertionError):
        canary.assert_untouched()


def test_the_hardlink_trick_arrives_as_nothing(tmp_path: Path, canary: Canary) -> None:
    target = tmp_path / "target"
    result = extract(_trick(canary), target)
    assert inventory(target) == {}
    reasons = {d.name: d.reason for d in result.dropped}
    assert reasons["./logs/agent/L0"] == "FIFO" and "absolute symlink" in reasons["./logs/agent/L1"]
    assert "not a regular file of this transfer" in reasons["./x-fifo"] and result.dropped_count == 4


def test_hardlink_targets_are_rebased_with_the_subtree(tmp_path: Path, canary: Canary) -> None:
    """As Docker names /logs: a hardlink to logs/agent/L0 means /logs/agent/L0, never the
    nested /logs/agent/logs/agent/L0 the workflow planted."""
    archive = tar(
        member("logs/agent/L0", data=b"real sample\n"),
        member("logs/agent/logs/agent/L0", tarfile.CHRTYPE),
        member("logs/agent/logs/agent/L1", tarfile.FIFOTYPE),
        member("logs/agent/sample.json", tarfile.LNKTYPE, link="logs/agent/L0"),
        member("logs/agent/nested", tarfile.LNKTYPE, link="logs/agent/logs/agent/L1"),
        member("logs/verifier/outside.txt", data=b"other subtree"),
        member("logs/agent/to-verifier", tarfile.LNKTYPE, link="logs/verifier/outside.txt"),
    )
    target = tmp_path / "agent"
    result = extract(archive, target, subtree="logs/agent")
    assert (target / "sample.json").read_bytes() == b"real sample\n"
    assert inventory(target) == {"L0": "file 644", "sample.json": "file 644"}
    assert {d.name for d in result.dropped} == {
        "logs/agent/logs/agent/L0",
        "logs/agent/logs/agent/L1",
        "logs/agent/nested",
        "logs/agent/to-verifier",
    }


# ── special files, names, links, modes ───────────────────────────────────────


def test_devices_fifos_and_escaping_names_are_dropped_and_logged(
    tmp_path: Path, canary: Canary, caplog: pytest.LogCaptureFixture
) -> None:
    escape = os.path.relpath(canary.path, tmp_path / "target")
    archive = tar(
        member("x-disk", tarfile.BLKTYPE),
        member("x-null", tarfile.CHRTYPE),
        member("x-fifo", tarfile.FIFOTYPE),
        member(str(canary.path), data=b"pwned"),
        member(escape, data=b"pwned"),
        member("ok.txt", data=b"ok"),
    )
    with caplog.at_level(logging.WARNING):
        result = extract(archive, tmp_path / "target")
    assert inventory(tmp_path / "target") == {"ok.txt": "file 644"}
    assert [d.reason for d in result.dropped] == [
        "device node",
        "device node",
        "FIFO",
        "absolute name",
        "'..' in the name",
    ]
    assert "5 entries dropped" in caplog.text and "x-disk" in caplog.text


def test_links_out_of_the_tree_are_dropped_even_through_other_links(tmp_path: Path, canary: Canary) -> None:
    target = tmp_path / "target"
    archive = tar(
        member("abs", tarfile.SYMTYPE, link=str(canary.path)),
        member("up", tarfile.SYMTYPE, link="../outside/canary.txt"),
        member("deep/er/root", tarfile.SYMTYPE, link="../.."),  # the tree's own root: fine
        member("parent", tarfile.SYMTYPE, link="deep/er/root/.."),  # lexically inside, really outside
        member("inside", tarfile.SYMTYPE, link="deep/er"),
        member("data.txt", data=b"d"),
        member("deep/er/sibling", tarfile.SYMTYPE, link="../../data.txt"),
    )
    result = extract(archive, target)
    assert inventory(target) == {
        "data.txt": "file 644",
        "deep": "dir 755",
        "deep/er": "dir 755",
        "deep/er/root": "link -> ../..",
        "deep/er/sibling": "link -> ../../data.txt",
        "inside": "link -> deep/er",
    }
    assert {d.name for d in result.dropped} == {"abs", "up", "parent"}
    assert (target / "deep/er/sibling").read_bytes() == b"d"


def test_a_link_planted_as_a_parent_is_never_written_through(tmp_path: Path, canary: Canary) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "pre").symlink_to(canary.path.parent)  # left by an earlier transfer, say
    (target / "sample.json").symlink_to(canary.path)
    archive = tar(
        member("d", tarfile.SYMTYPE, link="sub"),
        member("d/canary.txt", data=b"pwned"),
        member("pre/canary.txt", data=b"pwned"),
        member("sample.json", data=b"{}"),
        member("sub/x", data=b"x"),
    )
    result = extract(archive, target)
    assert inventory(target) == {
        "d": "dir 755",
        "d/canary.txt": "file 644",
        "pre": "dir 755",
        "pre/canary.txt": "file 644",
        "sample.json": "file 644",
        "sub": "dir 755",
        "sub/x": "file 644",
    }
    assert [(d.name, d.reason) for d in result.dropped] == [("d", "symlink not made: a directory is in the way")]


def test_modes_are_masked_and_no_bit_survives(tmp_path: Path) -> None:
    archive = tar(
        member("suid", data=b"#!/bin/sh\n", mode=0o4755),
        member("sgid", data=b"x", mode=0o2646),
        member("world", data=b"x", mode=0o666),
        member("sticky", tarfile.DIRTYPE, mode=0o1777),
        member("none", data=b"x", mode=0o000),
    )
    extract(archive, tmp_path / "target")
    assert inventory(tmp_path / "target") == {
        "none": "file 644",
        "sgid": "file 644",
        "sticky": "dir 755",
        "suid": "file 755",
        "world": "file 644",
    }
    assert os.lstat(tmp_path / "target" / "suid").st_mtime == 1_700_000_000


def test_pax_path_and_linkpath_are_the_names_that_count(tmp_path: Path, canary: Canary) -> None:
    """A PAX header overrides the ustar name; the one checked is the one written."""
    archive = tar(
        member("safe.txt", data=b"pwned", pax={"path": "../outside/canary.txt"}),
        member("ok-link", tarfile.SYMTYPE, link="safe.txt", pax={"linkpath": str(canary.path)}),
        member("hard", tarfile.LNKTYPE, link="safe.txt", pax={"linkpath": "../outside/canary.txt"}),
        member("r\u00e9sum\u00e9.txt", data=b"cv"),
        member("plain-name", data=b"moved", pax={"path": "dir/\u00e9t\u00e9.txt"}),
    )
    result = extract(archive, tmp_path / "target")
    assert inventory(tmp_path / "target") == {
        "dir": "dir 755",
        "dir/\u00e9t\u00e9.txt": "file 644",
        "r\u00e9sum\u00e9.txt": "file 644",
    }
    assert (tmp_path / "target" / "r\u00e9sum\u00e9.txt").read_bytes() == b"cv"
    assert [d.name for d in result.dropped] == ["../outside/canary.txt", "ok-link", "hard"]


# ── correctness ──────────────────────────────────────────────────────────────


def test_hardlinked_files_both_arrive(tmp_path: Path) -> None:
    archive = tar(
        member("logs/agent/aaa.txt", data=b"same"),
        member("logs/agent/bbb.txt", tarfile.LNKTYPE, link="logs/agent/aaa.txt"),
        member("logs/agent/sample.json", data=b"{}"),
    )
    result = extract(archive, tmp_path / "agent", subtree="logs/agent")
    assert (tmp_path / "agent/aaa.txt").read_bytes() == (tmp_path / "agent/bbb.txt").read_bytes() == b"same"
    assert (result.files, result.bytes, result.dropped_count) == (3, 10, 0)


def test_later_members_win_and_existing_files_are_replaced(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "old.txt").write_text("host")
    archive = tar(
        member("old.txt", data=b"new"),
        member("f", data=b"file first"),
        member("f", tarfile.SYMTYPE, link="old.txt"),
        member("g", tarfile.SYMTYPE, link="old.txt"),
        member("g", data=b"file last"),
    )
    extract(archive, target)
    assert inventory(target) == {"f": "link -> old.txt", "g": "file 644", "old.txt": "file 644"}
    assert (target / "g").read_bytes() == b"file last" and (target / "old.txt").read_bytes() == b"new"


def limits(**overrides: int) -> TransferLimits:
    base = {"max_bytes": 1000, "max_file_bytes": 100, "max_files": 20, "max_depth": 4, "max_path_bytes": 40}
    return TransferLimits(**{**base, **overrides})


@pytest.mark.parametrize(
    ("members", "what"),
    [
        ([member("big", data=b"x" * 101)], "file 'big' (bytes) is 101, over the bound of 100"),
        ([member(f"f{i}", data=b"x" * 90) for i in range(12)], "the total of file bytes is 1080"),
        (
            [member("a", data=b"x" * 90)]
            + [member(f"h{i}", tarfile.LNKTYPE, link="a") for i in range(10)]
            + [member("z", data=b"x" * 90)],
            "the total of file bytes is 1080",
        ),
        ([member(f"d{i}", tarfile.DIRTYPE) for i in range(21)], "the number of entries is 21, over the bound of 20"),
        ([member("a/b/c/d/e", data=b"x")], "the depth of 'a/b/c/d/e' is 5"),
        ([member("n" * 41, data=b"x")], "is 41, over the bound of 40"),
    ],
)
def test_bounds_raise_a_clear_error(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], what: str) -> None:
    with pytest.raises(TransferLimitError) as raised:
        extract(tar(*members), tmp_path / "target", limits=limits())
    assert isinstance(raised.value, OsmosisHarborError)
    assert str(raised.value).startswith("sandbox output /logs/agent: ") and what in str(raised.value)


def test_a_corrupt_archive_is_a_clear_error(tmp_path: Path) -> None:
    data = tar(member("a", data=b"x" * 5000)).getvalue()
    with pytest.raises(UnreadableArchiveError, match="sandbox output /logs/agent: not a readable tar"):
        extract(io.BytesIO(data[:2048]), tmp_path / "target")
    with pytest.raises(UnreadableArchiveError):
        extract(io.BytesIO(b"\x01" * 4096), tmp_path / "target")


def test_a_single_file_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path, canary: Canary) -> None:
    target = tmp_path / "trial" / "error.json"
    target.parent.mkdir()
    target.symlink_to(canary.path)
    write_file(target, b'{"message": "m"}')
    assert not target.is_symlink() and target.read_bytes() == b'{"message": "m"}'


def test_names_in_logs_and_errors_never_carry_a_long_token(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A workflow knows its API key and can name files with it: the warning and the bound
    error show such names masked (the result object keeps them, for the host's own use)."""
    key = "sk-" + "a1B2c3D4e5" * 4
    with caplog.at_level(logging.WARNING):
        result = extract(
            tar(member(f"{key}.fifo", tarfile.FIFOTYPE), member("x", tarfile.SYMTYPE, link=f"/{key}")), tmp_path / "t"
        )
    assert result.dropped_count == 2 and key in result.dropped[0].name
    assert "entries dropped" in caplog.text and key not in caplog.text and "sk-a…" in caplog.text
    with pytest.raises(TransferLimitError) as raised:
        extract(tar(member(f"{key}.bin", data=b"x" * 101)), tmp_path / "u", limits=limits())
    assert key not in str(raised.value) and "'sk-a….bin'" in str(raised.value)
