"""The front's view of one worker process: its spawn, the rollouts it holds, its death.

A worker is started with one end of a socket pair as its only channel (the fd is inherited,
its number is the only argument), sent its ``Init`` and awaited until ``Ready``. Each rollout
submitted to it gets a queue that the worker's ``Status`` and ``Done`` messages for that
rollout are put on, in order; when the socket reaches EOF (the process exited, however), every
rollout still held gets ``WORKER_DIED`` instead, after the front's ``on_death`` (which reaps
what the dead process left) has run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

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
    from_worker,
    read_message,
    write_message,
)
from osmosis_harbor.errors import ConfigError

__all__ = ["WORKER_DIED", "Event", "WorkerHandle"]

log = logging.getLogger(__name__)

WORKER_DIED = "worker died"
Event = Status | Done | str  # str: WORKER_DIED
READY_TIMEOUT_SEC = 600.0  # a worker builds its backend (bundle from the cache, SDK checks)


def _recv_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < size:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise TimeoutError("no answer from the worker process")
        chunk = sock.recv(size - got)
        if not chunk:
            raise WireClosed("the worker process closed its socket")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class WorkerHandle:
    """One worker process and the rollouts it runs."""

    def __init__(self, index: int, init: Init) -> None:
        self.index = index
        self.work_root = Path(init.work_root)
        self.max_concurrent = init.n_concurrent
        self.sock, child = socket.socketpair()
        argv = [sys.executable, "-m", "osmosis_harbor.backend.workers.worker", "--fd", str(child.fileno())]
        try:
            self.process = subprocess.Popen(argv, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            child.close()
        self.pid = self.process.pid
        self.sock.sendall(frame(init))
        self.stopping = False  # a stop asked by the front: its end is no death to recover from
        self.pending: dict[str, asyncio.Queue[Event]] = {}
        self.alive = False
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    def wait_ready(self, timeout: float = READY_TIMEOUT_SEC) -> None:
        """Block until the worker said ``Ready`` (it built its backend), or raise saying why not."""
        deadline = time.monotonic() + timeout
        try:
            size = int.from_bytes(_recv_exactly(self.sock, 4, deadline), "big")
            if size > MAX_MESSAGE_BYTES:
                raise WireClosed(f"a first message of {size} bytes")
            message = from_worker(_recv_exactly(self.sock, size, deadline))
        except (OSError, ValueError) as exc:
            self.kill()
            code = self.process.poll()
            raise ConfigError(
                f"worker process {self.index} (pid {self.pid}) did not start: {exc}"
                + (f" (exit status {code}; its error is on stderr above)" if code is not None else "")
            ) from None
        if not isinstance(message, Ready):
            self.kill()
            raise ConfigError(f"worker process {self.index} answered {message.kind} before ready")
        self.alive = True

    async def attach(self, on_death: Callable[[WorkerHandle], Awaitable[None]]) -> None:
        """Move the socket onto this event loop and start reading the worker's messages."""
        reader, self._writer = await asyncio.open_connection(sock=self.sock)
        self._reader_task = asyncio.create_task(self._read(reader, on_death))

    @property
    def attached(self) -> bool:
        return self._writer is not None

    @property
    def load(self) -> float:
        return len(self.pending) / self.max_concurrent

    def submit(self, message: Submit) -> asyncio.Queue[Event]:
        assert self._writer is not None and self.alive
        events: asyncio.Queue[Event] = asyncio.Queue()
        self.pending[message.request.id] = events
        write_message(self._writer, message)
        return events

    def cancel(self, rollout_id: str) -> None:
        if self.alive and self._writer is not None and not self._writer.is_closing():
            write_message(self._writer, Cancel(rollout_id=rollout_id))

    def forget(self, rollout_id: str) -> None:
        self.pending.pop(rollout_id, None)

    async def _read(self, reader: asyncio.StreamReader, on_death: Callable[[WorkerHandle], Awaitable[None]]) -> None:
        try:
            while True:
                message = await read_message(reader, from_worker=True)
                events = self.pending.get(getattr(message, "rollout_id", ""))
                if events is not None:
                    events.put_nowait(message)
        except (WireClosed, ValueError) as exc:
            if not isinstance(exc, WireClosed):
                log.error("worker %d sent a message it may not send: %s", self.index, exc)
                self.kill()
        finally:
            self.alive = False
            await asyncio.to_thread(self.process.wait)
            try:
                await on_death(self)
            finally:
                for events in self.pending.values():
                    events.put_nowait(WORKER_DIED)
                if self._writer is not None:
                    self._writer.close()

    async def stop(self, timeout: float) -> bool:
        """Ask the worker to drain and exit; True when it did within ``timeout``, else it is killed."""
        self.stopping = True
        if self._writer is not None and not self._writer.is_closing():
            write_message(self._writer, Shutdown())
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()
        elif self._writer is None:  # never attached to a loop: the socket is still blocking
            with contextlib.suppress(OSError):
                self.sock.sendall(frame(Shutdown()))
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), timeout)
        except TimeoutError:
            self.kill()
            await asyncio.to_thread(self.process.wait)
            return False
        finally:
            if self._reader_task is not None:
                await asyncio.gather(self._reader_task, return_exceptions=True)
        return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
