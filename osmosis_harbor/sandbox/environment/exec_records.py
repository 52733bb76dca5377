"""An exec whose launch or result read met an API fault is resolved through its record in the
sandbox: the command runs once, and its result reaches the host.

On SkyPilot an exec is a launch and then a result read (``handle.wait()``, ``stdout.read()``),
each its own API call. A connection reset or a 503 on the read would lose the sandbox to the
trial (the command may have run, and running it again is unsafe), so a rollout would end
``internal_error`` or use up an ``infra_retries`` attempt for a fault of the API alone. SkyPilot
documents no way to read an exec's result again: a handle's ``wait()`` polls, but nothing says a
poll that failed may be repeated, or that the result outlives it. So the result is recorded where
the command ran: each exec runs under a small POSIX ``sh`` wrapper that keeps the command's exit
status and its output in a directory of its own (``RECORDS_DIR/<exec id>``, the id made by the
host), and passes both through unchanged. After a fault on the read, the host waits for the
status file through the file API (``read_bytes``: a read, retried on API faults as any read is),
then reads the output back, bounded, with a fresh read-only exec (safe to repeat).

A fault on the *launch* (a reset, a timeout, a 503 the SDK gave up on) may have lost the answer
of a command that started, or a request that never arrived. The host launches it again under the
same record: the wrapper claims the record with one ``mkdir``, so whichever launch arrives first
runs the command and any other waits for its status and passes its result through (started:
attached to; never started: run now). A relaunch that finds no record possible refuses, and the
original fault stands.

What is re-read is sandbox output, as the original result was: the exit status must parse as an
integer from 0 to 255 and each stream is cut at ``Settings.exec_output_max_bytes`` (the bound a
local exec's output has); a record that does not
parse, or never appears within the exec's own timeout, leaves the original fault standing (the
sandbox is lost to the trial). Once the host holds a result, the next exec removes the record's
output and keeps its dir and status: the claim a late launch of it still meets.

Only SDKs whose results cross an API (``SandboxImplementation.records_exec_results``) get records:
the local Docker engine answers an exec in one call.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from osmosis_harbor.sandbox.environment.session import drain_stream
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.sdk.errors import is_api_fault, is_missing
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, retry_safe
from osmosis_harbor.settings import Settings

__all__ = ["RECORDS_DIR", "ExecRecorder", "Launch", "RecordedExec", "parse_status"]

log = logging.getLogger(__name__)

# Not /tmp: a sandbox's /tmp may be a bounded tmpfs (the Docker SDK's is), the task's own space.
RECORDS_DIR = "/var/tmp/.osmosis-harbor-execs"
# How long past its own timeout a command's record may take to appear (the wrapper's last writes).
RECORD_GRACE_SEC = 30.0

# $1: the record dir; $2: records already read; $3: the bound; $4: "launch", or "relaunch" after a
# launch whose answer was lost; then the command's argv. The record dir is claimed by one
# ``mkdir``: of two launches of one record (the lost one arriving late, or the relaunch), one runs
# the command and the other waits for its status and passes its result through, so a relaunch
# never runs a command twice. Read records keep their dir and status (a claim a late launch still
# meets) and lose their output. Each stream keeps its last $3 bytes only (tail -c): a command
# printing gigabytes writes no more than that to the sandbox's disk. The command does not inherit
# fd 3 (the stdout pipe's second handle): a service it leaves behind with its own streams
# redirected must not hold the pipe open. Where no record can be made, a first launch runs the
# command unrecorded and a relaunch refuses (``RELAUNCH_REFUSED``): it cannot know what ran.
RELAUNCH_REFUSED = 125
_REFUSAL = "osmosis-harbor: no exec record to resume"
_WRAPPER = (
    'd=$1; old=$2; b=$3; m=$4; shift 4; for o in $old; do rm -f "'
    + RECORDS_DIR
    + '/$o/out" "'
    + RECORDS_DIR
    + '/$o/err"; done; '
    'if { mkdir -p "' + RECORDS_DIR + '" && mkdir "$d"; } 2>/dev/null; then '
    '{ : >"$d/out" && : >"$d/err"; } 2>/dev/null || exec "$@"; '
    '{ { "$@" 3>&-; echo "$?" >"$d/rc.part"; } 2>&1 1>&3 | tail -c "$b" >"$d/err"; } 3>&1 | tail -c "$b" >"$d/out"; '
    'rc=$(cat "$d/rc.part" 2>/dev/null) || rc=1; mv -f "$d/rc.part" "$d/rc"; '
    'cat "$d/out"; cat "$d/err" >&2; exit "$rc"; '
    'elif [ -d "$d" ]; then while [ ! -e "$d/rc" ]; do sleep 0.1 2>/dev/null || sleep 1; done; '
    'cat "$d/out" 2>/dev/null; cat "$d/err" >&2 2>/dev/null; exit "$(cat "$d/rc")"; '
    'elif [ "$m" = launch ]; then exec "$@"; '
    'else echo "' + _REFUSAL + '" >&2; exit ' + str(RELAUNCH_REFUSED) + "; fi"
)
# $1: the record dir; $2: the bound. Read-only: safe to run again after a fault of its own.
_REREAD = 'head -c "$2" "$1/out"; head -c "$2" "$1/err" >&2'

# An argv launched in the sandbox, its handle returned (the session's, behind the guard).
Launch = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Recovered:
    """An exec's result as re-read from its record."""

    return_code: int
    stdout: str
    stderr: str


class _Text:
    """``handle.stdout`` / ``handle.stderr`` once the result is held: ``read()`` answers it."""

    def __init__(self, text: str | None) -> None:
        self._text = text

    async def read(self) -> str | None:
        return self._text


class RecordedExec:
    """The handle Harbor gets for a recorded exec: ``wait()`` reads the whole result (status,
    then both streams) from the SDK's handle, or, after an API fault, from the record.
    ``launch_fault``: the fault that lost a first launch's answer, raised when the relaunch finds
    no record to resume (nothing can say whether the command ran)."""

    def __init__(
        self,
        handle: Any,
        recorder: ExecRecorder,
        record: str,
        deadline: float,
        launch_fault: BaseException | None = None,
    ) -> None:
        self._handle = handle
        self._launch_fault = launch_fault
        self._recorder = recorder
        self._record = record
        self._deadline = deadline
        self.stdout = _Text(None)
        self.stderr = _Text(None)

    async def wait(self) -> int | None:
        try:
            code = await self._handle.wait()
            stdout = await drain_stream(getattr(self._handle, "stdout", None))
            stderr = await drain_stream(getattr(self._handle, "stderr", None))
        except Exception as exc:
            if not is_api_fault(exc):
                raise
            log.info("reading the result of exec %s failed (%s): reading its record instead", self._record, exc)
            recovered = await self._recorder.reread(self._record, self._deadline, exc)
            code, stdout, stderr = recovered.return_code, recovered.stdout, recovered.stderr
        if self._launch_fault is not None and code == RELAUNCH_REFUSED and _REFUSAL in (stderr or ""):
            log.info("exec %s: its launch's answer was lost and no record says what ran", self._record)
            raise self._launch_fault
        self._recorder.record_read(self._record)
        self.stdout, self.stderr = _Text(stdout), _Text(stderr)
        return code


def _on_api_faults(retry: ApiRetry) -> AsyncRetrying:
    """A launch whose answer an API fault lost is launched again under the same record: the
    record's claim runs the command once whichever launch arrives first (``_WRAPPER``); a
    read-only re-read is repeated the same way."""
    return AsyncRetrying(
        retry=retry_if_exception(is_api_fault),
        stop=stop_after_attempt(retry.attempts),
        wait=wait_exponential(multiplier=0.2, max=retry.max_wait),
        reraise=True,
    )


def parse_status(data: bytes) -> int | None:
    """The exit status a record holds, or None when it is not one (sandbox output: checked)."""
    text = data[:8].decode("ascii", errors="replace").strip()
    if len(data) > 8 or not text.isdigit() or not 0 <= int(text) <= 255:
        return None
    return int(text)


class ExecRecorder:
    """Every exec dispatched under a record, when the SDK's results cross an API (``enabled``;
    see the module docstring). ``launch`` sends an argv to the sandbox; ``sandbox`` is the live
    handle, whose file API reads a record's status."""

    def __init__(
        self, state: EnvironmentState, launch: Launch, sandbox: Callable[[], Any], current: Settings, *, enabled: bool
    ) -> None:
        self._state = state
        self._launch = launch
        self._sandbox = sandbox
        self._settings = current
        self._retry = ApiRetry.of(current)
        self.enabled = enabled

    async def dispatch(
        self, argv: list[str], *, workdir: str | None, timeout_seconds: int, env: dict[str, str] | None = None
    ) -> Any:
        if not self.enabled:
            return await self._launch(argv, workdir=workdir, timeout_seconds=timeout_seconds, env=env)
        record = uuid.uuid4().hex
        done, self._state.records_read = " ".join(self._state.records_read), []
        bound = str(self._settings.exec_output_max_bytes)
        deadline = time.monotonic() + timeout_seconds + RECORD_GRACE_SEC
        launch_fault: BaseException | None = None
        async for attempt in _on_api_faults(self._retry):
            with attempt:
                mode = "launch" if launch_fault is None else "relaunch"
                wrapped = ["sh", "-c", _WRAPPER, "sh", f"{RECORDS_DIR}/{record}", done, bound, mode, *argv]
                try:
                    handle = await self._launch(wrapped, workdir=workdir, timeout_seconds=timeout_seconds, env=env)
                except Exception as exc:
                    if is_api_fault(exc):
                        log.info("the launch of exec %s failed (%s): relaunching it under its record", record, exc)
                        launch_fault = launch_fault or exc
                    raise
        return RecordedExec(handle, self, record, deadline, launch_fault)

    def record_read(self, record: str) -> None:
        """The host holds ``record``'s result: the next exec removes it from the sandbox."""
        self._state.records_read.append(record)

    async def reread(self, record: str, deadline: float, fault: BaseException) -> Recovered:
        """The result of the exec recorded as ``record``, once its status is there (waiting no
        longer than the exec's own timeout); raises ``fault`` when it cannot be had."""
        path = f"{RECORDS_DIR}/{record}"
        try:
            status = await self._wait_for_status(f"{path}/rc", deadline)
            code = parse_status(status)
            if code is None:
                raise ValueError(f"exec record {record}: {status[:16]!r} is not an exit status")
            stdout, stderr = await self._read_outputs(path)
        except Exception as exc:
            log.info("exec %s: its record cannot be read (%s): the sandbox is lost to the trial", record, exc)
            raise fault from exc
        return Recovered(code, stdout, stderr)

    async def _wait_for_status(self, path: str, deadline: float) -> bytes:
        sandbox = self._sandbox()
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_missing),  # not written yet: the command still runs
            stop=stop_after_delay(max(0.0, deadline - time.monotonic())),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            reraise=True,
        )
        return bytes(await retrying(retry_safe, "read_bytes", self._retry, sandbox.read_bytes.aio, path))

    async def _read_outputs(self, path: str) -> tuple[str, str]:
        bound = self._settings.exec_output_max_bytes
        argv = ["sh", "-c", _REREAD, "sh", path, str(bound)]
        async for attempt in _on_api_faults(self._retry):
            with attempt:
                handle = await self._launch(argv, workdir=None, timeout_seconds=60)
                await handle.wait()
                stdout = await drain_stream(getattr(handle, "stdout", None)) or ""
                stderr = await drain_stream(getattr(handle, "stderr", None)) or ""
        return stdout[:bound], stderr[:bound]
