"""Files a sandbox left in a trial directory are read on the host without trusting them
(``osmosis_harbor.trials.contract_files``): nothing blocks, nothing is followed, nothing
unbounded is read, and a nesting bomb is a clean error naming the file.

Each attack is planted for real (a FIFO made with ``os.mkfifo``, links to canary files under
the test's tmp dir) and has its positive control: the same place holding an ordinary file
is read, so the refusal is about the attack and not about the place."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from osmosis_harbor import settings
from osmosis_harbor.errors import ContractFileError
from osmosis_harbor.trials.contract_files import ContractBounds, FileKind, read_bytes, read_json, read_text

SAMPLE = "agent/sample.json"


@pytest.fixture
def trial(tmp_path: Path) -> Path:
    (tmp_path / "trial" / "agent").mkdir(parents=True)
    return tmp_path / "trial"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host file the sandbox must never get read into a result."""
    path = tmp_path / "host" / "canary.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "HOST-CANARY-SECRET"}]}))
    return path


def test_a_regular_sample_is_read(trial: Path) -> None:
    (trial / SAMPLE).write_text('{"messages": []}')
    assert read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current())) == {"messages": []}
    assert read_json(trial, "agent/missing.json", FileKind.SAMPLE, ContractBounds.of(settings.current())) is None
    assert read_json(trial / "no-such-trial", SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current())) is None


async def test_a_fifo_is_refused_without_blocking_the_event_loop(trial: Path) -> None:
    os.mkfifo(trial / SAMPLE)
    assert stat.S_ISFIFO(os.lstat(trial / SAMPLE).st_mode)  # the attack is in place: no writer will ever come
    beats = 0

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            beats += 1
            await asyncio.sleep(0)

    beating = asyncio.create_task(heartbeat())
    try:
        with pytest.raises(ContractFileError, match=r"^agent/sample\.json: a FIFO, not a regular file"):
            await asyncio.to_thread(read_json, trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))
    finally:
        beating.cancel()
    assert beats > 0  # the loop kept running while the read was refused


def test_a_fifo_swapped_in_after_the_lstat_does_not_block(trial: Path) -> None:
    """O_NONBLOCK: even a FIFO met at open time (past the lstat) cannot hold the read."""
    os.mkfifo(trial / SAMPLE)
    fd = os.open(trial / SAMPLE, os.O_RDONLY | os.O_NONBLOCK)  # what the reader's open does: returns at once
    try:
        assert os.read(fd, 10) == b""
    finally:
        os.close(fd)


def test_a_link_to_a_host_file_is_not_followed(trial: Path, canary: Path) -> None:
    (trial / SAMPLE).symlink_to(canary)
    assert "HOST-CANARY-SECRET" in (trial / SAMPLE).read_text()  # a plain read would hand it over
    with pytest.raises(ContractFileError, match="a symbolic link, not a regular file") as caught:
        read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))
    assert "HOST-CANARY-SECRET" not in str(caught.value)
    assert str(canary.parent) not in str(caught.value)  # the error names the trial's file, not host paths


def test_a_linked_directory_on_the_way_is_not_followed(tmp_path: Path, canary: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "agent").symlink_to(canary.parent, target_is_directory=True)
    (canary.parent / "sample.json").write_text(canary.read_text())
    assert (trial / SAMPLE).is_file()  # through the link, a host file sits where the sample is read
    with pytest.raises(ContractFileError, match="agent is not a plain directory"):
        read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))


def test_a_relative_link_inside_the_trial_is_refused_too(trial: Path) -> None:
    (trial / "agent" / "real.json").write_text("{}")
    (trial / SAMPLE).symlink_to("real.json")
    with pytest.raises(ContractFileError, match="symbolic link"):
        read_text(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_a_nesting_bomb_is_a_clean_error_naming_the_file(trial: Path, opener: str) -> None:
    (trial / SAMPLE).write_text(opener * 200_000)
    with pytest.raises(RecursionError):  # positive control: what json.loads does with it
        json.loads((trial / SAMPLE).read_text())
    with pytest.raises(ContractFileError, match=r"^agent/sample\.json: JSON nested deeper than 100 levels"):
        read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))


def test_the_depth_bound_is_exact(trial: Path) -> None:
    (trial / SAMPLE).write_text("[" * 100 + "]" * 100)
    assert read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current())) is not None
    (trial / SAMPLE).write_text("[" * 101 + "]" * 101)  # parses fine, but over the bound
    with pytest.raises(ContractFileError, match="deeper than 100"):
        read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))


def test_sizes_are_bounded_per_kind_and_settable(trial: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (trial / "agent" / "error.json").write_text(json.dumps({"message": "x" * 5000}))
    assert read_json(trial, "agent/error.json", FileKind.ERROR, ContractBounds.of(settings.current())) is not None
    monkeypatch.setenv("OSMOSIS_HARBOR_MAX_ERROR_BYTES", "4096")
    with pytest.raises(ContractFileError, match=r"^agent/error\.json: 50\d\d bytes, over the 4096-byte bound"):
        read_json(trial, "agent/error.json", FileKind.ERROR, ContractBounds.of(settings.current()))
    assert (
        read_bytes(trial, "agent/error.json", FileKind.SAMPLE, ContractBounds.of(settings.current())) is not None
    )  # another kind, another bound


def test_not_utf8_and_not_json_are_named(trial: Path) -> None:
    (trial / SAMPLE).write_bytes(b"\xff\xfe{}")
    with pytest.raises(ContractFileError, match=r"^agent/sample\.json: not UTF-8"):
        read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))
    (trial / SAMPLE).write_text("{nope")
    with pytest.raises(ContractFileError, match=r"^agent/sample\.json: not JSON"):
        read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))


def test_lone_surrogates_are_spelled_in_every_string_and_pairs_kept(trial: Path) -> None:
    """``"\\ud800"`` is valid JSON, but no UTF-8 text holds the string it decodes to: each is
    spelled as its escape (keys too, at any depth), while a surrogate pair stays its character."""
    (trial / SAMPLE).write_text(
        '{"messages": [{"role": "user", "content": "a\\ud800b \\ud83d\\ude00"}], "metrics": {"k\\udfff": 1}}'
    )
    plain = json.loads((trial / SAMPLE).read_text())
    with pytest.raises(UnicodeEncodeError):  # positive control: what the parser alone hands over
        json.dumps(plain, ensure_ascii=False).encode()
    document = read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))
    assert document == {"messages": [{"role": "user", "content": "a\\ud800b \U0001f600"}], "metrics": {"k\\udfff": 1}}
    json.dumps(document, ensure_ascii=False).encode()


def test_special_files_are_refused(trial: Path) -> None:
    (trial / SAMPLE).mkdir()
    with pytest.raises(ContractFileError, match="a directory, not a regular file"):
        read_json(trial, SAMPLE, FileKind.SAMPLE, ContractBounds.of(settings.current()))


def test_names_must_stay_beneath_the_trial(trial: Path) -> None:
    for bad in ("../x.json", "/etc/passwd", "agent/../../x"):
        with pytest.raises(ValueError, match="plain relative path"):
            read_json(trial, bad, FileKind.SAMPLE, ContractBounds.of(settings.current()))
