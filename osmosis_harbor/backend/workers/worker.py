"""A worker process: ``python -m osmosis_harbor.backend.workers.worker --fd N``.

It builds an ``InProcessBackend`` from the front's options with its share of the queue's slots
(and the front's retry policy, which already carries our exclusions), then runs each submitted
rollout inside a ``RolloutContext`` made from the ``Submit`` message (the backend reads the chat
URL and key from it, as it does under the osmosis server), streams the rollout's status changes
back and answers with its outcome. Its sandboxes carry this process as owner: if it dies, the
front reaps them through the ledger.

The socket (fd ``N``, inherited) is the only channel: the key is never in argv, the
environment or a file. A closed socket means the front is gone: the worker shuts its backend
down (no sandbox left) and exits.

Every rollout's ``Done`` reaches the front, whatever its outcome holds: one that cannot be
encoded (text no UTF-8 can carry, over the wire's bound) is replaced by a failure naming why
(``sendable``). Sandbox text is made safe where it enters the host (``trials/contract_files``);
this is the last line, so that a miss there costs one rollout its sample, never its end: the
front waits for each ``Done``, and a rollout it never hears of stays "running" until shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import logging
import os
import pickle
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.context import RolloutContext, RolloutProgress
from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

from osmosis_harbor.backend.outcome import refused
from osmosis_harbor.backend.workers.messages import (
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
    write_message,
)

__all__ = ["main", "sendable"]

log = logging.getLogger(__name__)
_REASON_CHARS = 500


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def sendable(message: Any) -> bytes | None:
    """``message`` framed for the wire; when it cannot be (pydantic cannot encode it, or it is
    over the wire's bound), a ``Done`` in its place that ends the rollout with an error naming
    why, or None for a ``Status`` (the ``Done`` that follows says how the rollout ended).

    An outcome that cannot be encoded came through the trial's files, which the sandbox wrote:
    its rollout fails as one whose sample the host will not use (``validation_error``), as an
    unusable ``sample.json`` does. A ``Done`` reporting an exception keeps reporting it,
    in words the wire can carry."""
    try:
        return frame(message)
    except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
        reason = _encodable(f"{type(exc).__name__}: {exc}")[:_REASON_CHARS]
    if not isinstance(message, Done):
        log.error("a %s message could not be sent to the front: %s", type(message).__name__, reason)
        return None
    if message.outcome is not None:
        extra = message.outcome.workflow.extra_fields or {}
        failed = refused(
            f"the rollout's result could not be sent from its worker process ({reason})",
            {"failed_phase": _encodable(str(extra.get("failed_phase") or "agent"))},
            RolloutErrorCategory.VALIDATION_ERROR,
        )
        replacement = Done(rollout_id=message.rollout_id, outcome=failed)
    else:
        replacement = Done(
            rollout_id=message.rollout_id,
            cancelled=message.cancelled,
            error=None if message.error is None else _encodable(message.error)[: 4 * _REASON_CHARS],
        )
    log.error(
        "rollout %s: its Done could not be sent as it was (%s); sent a failure instead", message.rollout_id, reason
    )
    return frame(replacement)


class _Worker:
    """One worker's backend and the rollouts it runs."""

    def __init__(self, backend: Any, writer: asyncio.StreamWriter) -> None:
        self.backend = backend
        self.writer = writer
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def _send(self, message: Any) -> None:
        if not self.writer.is_closing() and (data := sendable(message)) is not None:
            self.writer.write(data)

    def _on_status(self, rollout_id: str, status: RolloutStatus) -> None:
        state = self.backend.tracker.get(rollout_id)
        self._send(
            Status(
                rollout_id=rollout_id,
                status=status,
                trial_name=state.trial_name if state is not None else None,
                task_id=state.task_id if state is not None else None,
                started_at=state.started_at if state is not None else None,
            )
        )

    def submit(self, message: Submit) -> None:
        rollout_id = message.request.id
        task = asyncio.create_task(self._run(message))
        self.tasks[rollout_id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(rollout_id, None))

    async def _run(self, message: Submit) -> None:
        rollout_id = message.request.id
        # RUNNING first, as the server's own progress is when execute() starts: the backend's
        # QUEUED (waiting for a slot) is then a change, and reaches the front.
        progress = RolloutProgress(
            status=RolloutStatus.RUNNING, on_status=lambda status: self._on_status(rollout_id, status)
        )
        context = RolloutContext(
            chat_completions_url=message.chat_completions_url,
            api_key=message.api_key,
            rollout_id=rollout_id,
            progress=progress,
        )
        try:
            with context:
                outcome = await self.backend.execute(message.request)
        except asyncio.CancelledError:
            self._send(Done(rollout_id=rollout_id, cancelled=True))
            raise
        except Exception as exc:  # the server reports a bug as a failure: so does the front
            self._send(Done(rollout_id=rollout_id, error=f"{type(exc).__name__}: {exc}"))
            return
        self._send(Done(rollout_id=rollout_id, outcome=outcome))

    def cancel(self, message: Cancel) -> None:
        answer = self.backend.cancel_rollouts(ids=[message.rollout_id])
        task = self.tasks.get(message.rollout_id)
        if answer.get(message.rollout_id) == "not_found" and task is not None:
            task.cancel()  # submitted, not yet admitted by the backend: nothing else to stop

    async def shutdown(self) -> None:
        await self.backend.shutdown()
        pending = [t for t in self.tasks.values() if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()


def _backend(init: Init) -> Any:
    """The in-process backend this worker runs its rollouts on."""
    for entry in reversed(init.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    from osmosis_harbor.backend.in_process import InProcessBackend
    from osmosis_harbor.backend.options import BackendOptions
    from osmosis_harbor.harbor_compat.queue_facts import make_queue

    kwargs = pickle.loads(base64.b64decode(init.options))  # noqa: S301 - the front's own options
    options = BackendOptions.parse(
        orchestrator=make_queue(init.n_concurrent, init.retry_config),
        trials_dir=Path(init.trials_dir),
        workers=1,
        **kwargs,
    )
    return InProcessBackend(options, work_root=Path(init.work_root))


async def _serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock)
    init = await read_message(reader, from_worker=False)
    assert isinstance(init, Init), f"the first message must be init, not {init.kind}"
    worker = _Worker(_backend(init), writer)
    write_message(writer, Ready(pid=os.getpid(), max_concurrent=init.n_concurrent))
    await writer.drain()
    front_gone = False
    try:
        while True:
            try:
                message = await read_message(reader, from_worker=False)
            except WireClosed:
                front_gone = True  # killed, say: nobody else will remove what this worker made
                break
            if isinstance(message, Submit):
                worker.submit(message)
            elif isinstance(message, Cancel):
                worker.cancel(message)
            elif isinstance(message, Shutdown):
                break
    finally:
        await worker.shutdown()
        writer.close()
        if front_gone:
            _remove_roots(Path(init.work_root))


def _remove_roots(work_root: Path) -> None:
    """This worker's root, then the front's ``workers/`` and root when nothing else is in them
    (retained trials keep the front's root)."""
    shutil.rmtree(work_root, ignore_errors=True)
    for directory in (work_root.parent, work_root.parent.parent):
        try:
            directory.rmdir()
        except OSError:
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="osmosis_harbor.backend.workers.worker")
    parser.add_argument("--fd", type=int, required=True, help="the inherited socket to the front")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.fd))


if __name__ == "__main__":
    main()
