"""The key scrubber fails closed (``osmosis_harbor.key_custody``): link targets, name collisions,
unreadable files and keys across read chunks are handled; nothing it writes or logs holds
the key; a trial directory it cannot scrub is removed, its custody marker last.

Trees are made as a hostile workflow would leave them, under the test's tmp dir."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import quote

import pytest

from osmosis_harbor import key_custody
from osmosis_harbor.key_custody import MARKER, KeyCustody, scrub_tree
from osmosis_harbor.shim.errors import Redactor

KEY = 'sk-scrub/0123456789abcdef+"q"\\ é&x=1'
NAME = quote(KEY, safe="")  # the key's URL-encoded spelling: a file name can hold it ("/" cannot)


def spellings() -> list[bytes]:
    return [s.encode() for s in Redactor.for_key(KEY).secrets]


def assert_no_key(root: Path, *texts: str) -> None:
    for path in root.rglob("*"):
        for spelling in spellings():
            assert spelling not in os.fsencode(path.name), path
            if path.is_symlink():
                assert spelling not in os.fsencode(os.readlink(path)), path
            elif path.is_file():
                assert spelling not in path.read_bytes(), path
    for text in texts:
        for spelling in spellings():
            assert spelling.decode() not in text


def test_a_link_whose_target_holds_the_key_becomes_a_plain_file(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    link = tmp_path / "agent" / "x-link"
    link.symlink_to(f"/nonexistent/{KEY}/target")
    assert KEY in os.readlink(link)  # positive control: the key is in the tree, in a link target
    (tmp_path / "agent" / "plain-link").symlink_to("elsewhere")  # a link without the key stays
    report = scrub_tree(tmp_path, Redactor.for_key(KEY))
    assert report.complete and len(report.links) == 1
    assert not link.is_symlink() and link.is_file()
    assert "/nonexistent/***/target" in link.read_text()
    assert (tmp_path / "agent" / "plain-link").is_symlink()
    assert_no_key(tmp_path, *report.links)


def test_a_scrubbed_name_that_is_taken_gets_a_unique_one(tmp_path: Path) -> None:
    """A file named with the key beside a non-empty directory named like its scrubbed name."""
    (tmp_path / NAME).write_text("named with the key")
    clean = Redactor.for_key(KEY).text(NAME)
    assert clean == "***"
    (tmp_path / clean).mkdir()
    (tmp_path / clean / "occupant.txt").write_text("keep me")
    report = scrub_tree(tmp_path, Redactor.for_key(KEY))
    assert report.complete, report.failures
    assert (tmp_path / clean / "occupant.txt").read_text() == "keep me"
    assert (tmp_path / f"{clean}~1").read_text() == "named with the key"
    assert_no_key(tmp_path)


def test_keys_across_chunk_boundaries_are_scrubbed_with_bounded_reads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(key_custody, "SCRUB_CHUNK", 7)  # smaller than the key: every occurrence spans chunks
    data = b"".join(b"%d:" % i + s + b"|" for i, s in enumerate(spellings() * 5)) + b"tail"
    (tmp_path / "big.bin").write_bytes(data)
    report = scrub_tree(tmp_path, Redactor.for_key(KEY))
    assert report.complete and report.files == 1
    scrubbed = (tmp_path / "big.bin").read_bytes()
    assert scrubbed.count(b"***") == 15 and scrubbed.endswith(b"|tail")
    assert_no_key(tmp_path)


def test_an_unreadable_file_is_scrubbed_anyway(tmp_path: Path) -> None:
    secret = tmp_path / "locked.txt"
    secret.write_text(f"key={KEY}")
    secret.chmod(0)
    report = scrub_tree(tmp_path, Redactor.for_key(KEY))
    assert report.complete, report.failures
    assert_no_key(tmp_path)


def test_special_files_are_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / f"fifo-{NAME}")  # opening it for reading would block forever
    report = scrub_tree(tmp_path, Redactor.for_key(KEY))
    assert report.complete and report.renamed == 1
    assert_no_key(tmp_path)


def test_a_scrub_that_cannot_complete_removes_the_trial_and_logs_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    trial = tmp_path / "trials" / "t1"
    custody = KeyCustody()
    custody.hold(trial, KEY)
    (trial / "agent").mkdir()
    (trial / "agent" / "hoard.txt").write_text(KEY)
    (trial / "agent" / NAME).write_text("x")

    def refuse(src, dst, *args, **kwargs):  # the injected fault: the filesystem refuses every rename
        raise OSError(30, "Read-only file system", str(src), None, str(dst))

    monkeypatch.setattr(key_custody.os, "rename", refuse)
    with caplog.at_level(logging.DEBUG):
        removed = custody.seal(trial)
    assert removed and not trial.exists()
    assert "could not be scrubbed" in caplog.text  # positive control: the failure was logged...
    assert_no_key(tmp_path, caplog.text)  # ...without the key


def test_a_complete_scrub_keeps_the_trial(tmp_path: Path) -> None:
    trial = tmp_path / "trials" / "t2"
    custody = KeyCustody()
    custody.hold(trial, KEY)
    (trial / "agent").mkdir()
    (trial / "agent" / "hoard.txt").write_text(KEY)
    assert custody.seal(trial) is False
    assert (trial / "agent" / "hoard.txt").read_text() == "***" and not (trial / MARKER).exists()
