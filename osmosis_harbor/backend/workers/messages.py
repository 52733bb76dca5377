"""The wire between the front (the server's process) and a worker process: pydantic JSON,
length-prefixed, over a socket pair the worker inherits.

Why a socket pair and not argv, the environment or a file: the rollout's key travels in a
``Submit`` message, and nothing but the two processes' memory may ever hold it (a process's
argv and environment are readable in ``/proc`` by anyone on the host with its uid, files
outlive the processes). Each direction has its own union, so a message the other side may not
send fails validation instead of being acted upon.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Annotated, Any, Literal

from osmosis_ai.rollout.types import ExecutionOutcome, ExecutionRequest, RolloutStatus
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Cancel",
    "Done",
    "FromWorker",
    "Init",
    "Ready",
    "Shutdown",
    "Status",
    "Submit",
    "ToWorker",
    "WireClosed",
    "frame",
    "from_worker",
    "read_message",
    "write_message",
]

# An outcome carries a sample (bounded at 32 MiB by ``max_sample_bytes``) and its diagnostics.
MAX_MESSAGE_BYTES = 128 * 2**20
_HEADER = struct.Struct(">I")


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ── front -> worker ──────────────────────────────────────────────────────────
class Init(_Message):
    """Everything a worker needs to rebuild the backend (the first message, once)."""

    kind: Literal["init"] = "init"
    index: int
    options: str  # base64 of the pickled ``BackendOptions`` without the orchestrator (trusted: the front made it)
    n_concurrent: int  # this worker's share of the queue's slots
    retry_config: dict[str, Any]
    work_root: str  # inside the front's root: the front removes it when the worker dies
    trials_dir: str  # the front's: retained trials outlive the worker
    sys_path: list[str]  # the front's import path, so the options' classes unpickle


class Submit(_Message):
    """Run one rollout. ``api_key`` is the rollout's key: kept out of every repr."""

    kind: Literal["submit"] = "submit"
    request: ExecutionRequest
    chat_completions_url: str
    api_key: str | None = Field(default=None, repr=False)


class Cancel(_Message):
    kind: Literal["cancel"] = "cancel"
    rollout_id: str


class Shutdown(_Message):
    """Drain: cancel what still runs, remove every sandbox, then exit."""

    kind: Literal["shutdown"] = "shutdown"


# ── worker -> front ──────────────────────────────────────────────────────────
class Ready(_Message):
    kind: Literal["ready"] = "ready"
    pid: int
    max_concurrent: int


class Status(_Message):
    """A rollout's status changed in the worker (its trial left the queue, reached grading)."""

    kind: Literal["status"] = "status"
    rollout_id: str
    status: RolloutStatus
    trial_name: str | None = None
    task_id: str | None = None
    started_at: float | None = None


class Done(_Message):
    """A rollout ended: its outcome, or that it was cancelled, or the bug that ended it."""

    kind: Literal["done"] = "done"
    rollout_id: str
    outcome: ExecutionOutcome | None = None
    cancelled: bool = False
    error: str | None = None


ToWorker = Annotated[Init | Submit | Cancel | Shutdown, Field(discriminator="kind")]
FromWorker = Annotated[Ready | Status | Done, Field(discriminator="kind")]
_TO_WORKER: TypeAdapter[Init | Submit | Cancel | Shutdown] = TypeAdapter(ToWorker)
_FROM_WORKER: TypeAdapter[Ready | Status | Done] = TypeAdapter(FromWorker)


class WireClosed(ConnectionError):
    """The other side closed the socket (or died): no further message will come."""


def frame(message: _Message) -> bytes:
    """``message`` as it goes on the wire: its length, then its JSON."""
    body = message.model_dump_json().encode()
    if len(body) > MAX_MESSAGE_BYTES:
        raise ValueError(f"a {message.__class__.__name__} message of {len(body)} bytes is over the wire's bound")
    return _HEADER.pack(len(body)) + body


def from_worker(body: bytes) -> Ready | Status | Done:
    """A worker's message body, validated as what a worker may send."""
    return _FROM_WORKER.validate_json(body)


def write_message(writer: asyncio.StreamWriter, message: _Message) -> None:
    """Queue ``message`` on ``writer`` (the caller drains when it must wait for the bytes)."""
    writer.write(frame(message))


async def _read_body(reader: asyncio.StreamReader) -> bytes:
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_MESSAGE_BYTES:
            raise WireClosed(f"a message of {size} bytes announced, over the bound of {MAX_MESSAGE_BYTES}")
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise WireClosed(str(exc)) from None


async def read_message(reader: asyncio.StreamReader, *, from_worker: bool) -> Any:
    """The next message, validated as what the other side may send; ``WireClosed`` at EOF."""
    body = await _read_body(reader)
    return _FROM_WORKER.validate_json(body) if from_worker else _TO_WORKER.validate_json(body)
