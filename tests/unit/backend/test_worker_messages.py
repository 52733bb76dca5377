"""The wire between the front and a worker process (``backend/workers/messages.py``): framed
pydantic JSON, each direction its own union, the rollout's key never in a repr, and a peer's
bad frame (oversized, cut short, of the wrong direction) refused before it is acted upon.
In memory: a ``StreamReader`` fed the frames, no socket."""

from __future__ import annotations

import asyncio
import struct

import pytest
from osmosis_ai.rollout.types import ExecutionRequest, RolloutStatus
from pydantic import ValidationError

from osmosis_harbor.backend.workers import messages
from osmosis_harbor.backend.workers.messages import (
    MAX_MESSAGE_BYTES,
    Cancel,
    Done,
    Init,
    Ready,
    Shutdown,
    Status,
    Submit,
    WireClosed,
    frame,
    read_message,
)

KEY = "sk-rollout-secret-0123456789"
REQUEST = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "hi"}])
TO_WORKER = [
    Init(index=0, options="b64", n_concurrent=2, retry_config={}, work_root="/w", trials_dir="/t", sys_path=["/x"]),
    Submit(request=REQUEST, chat_completions_url="http://127.0.0.1:9/v1", api_key=KEY),
    Cancel(rollout_id="r1"),
    Shutdown(),
]
FROM_WORKER = [
    Ready(pid=123, max_concurrent=2),
    Status(rollout_id="r1", status=RolloutStatus.RUNNING, trial_name="trial-1"),
    Done(rollout_id="r1", cancelled=True),
]


def _reader(*chunks: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    if eof:
        reader.feed_eof()
    return reader


@pytest.mark.parametrize("message", TO_WORKER, ids=lambda m: m.kind)
async def test_a_message_to_a_worker_arrives_as_sent(message: object) -> None:
    assert await read_message(_reader(frame(message)), from_worker=False) == message  # type: ignore[arg-type]


@pytest.mark.parametrize("message", FROM_WORKER, ids=lambda m: m.kind)
async def test_a_message_from_a_worker_arrives_as_sent(message: object) -> None:
    assert await read_message(_reader(frame(message)), from_worker=True) == message  # type: ignore[arg-type]


@pytest.mark.parametrize(("message", "from_worker"), [(TO_WORKER[1], True), (FROM_WORKER[2], False)])
async def test_a_message_of_the_other_direction_is_refused(message: object, from_worker: bool) -> None:
    with pytest.raises(ValidationError):
        await read_message(_reader(frame(message)), from_worker=from_worker)  # type: ignore[arg-type]


async def test_unknown_fields_are_refused() -> None:
    body = b'{"kind": "cancel", "rollout_id": "r1", "also": "this"}'
    with pytest.raises(ValidationError, match="also"):
        await read_message(_reader(struct.pack(">I", len(body)) + body), from_worker=False)


def test_the_rollouts_key_travels_on_the_wire_but_never_in_a_repr() -> None:
    submit = TO_WORKER[1]
    assert KEY in frame(submit).decode()  # type: ignore[arg-type]
    assert KEY not in repr(submit) and KEY not in str(submit)


async def test_an_announced_oversized_message_is_refused_before_it_is_read() -> None:
    reader = _reader(struct.pack(">I", MAX_MESSAGE_BYTES + 1), eof=False)  # no body follows: none is awaited
    with pytest.raises(WireClosed, match="over the bound"):
        await asyncio.wait_for(read_message(reader, from_worker=True), 1)


@pytest.mark.parametrize("cut", [2, 10])
async def test_a_peer_that_dies_mid_message_closes_the_wire(cut: int) -> None:
    with pytest.raises(WireClosed):
        await read_message(_reader(frame(FROM_WORKER[0])[:cut]), from_worker=True)


def test_a_message_over_the_wires_bound_is_not_framed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "MAX_MESSAGE_BYTES", 1000)  # the bound, scaled down: no 128 MiB in a unit test
    with pytest.raises(ValueError, match="over the wire's bound"):
        frame(Done(rollout_id="r1", error="x" * 1001))
    assert frame(Done(rollout_id="r1", error="x" * 900))
