"""Finding the emulator server, or starting one on demand.

With ``OSMOSIS_HARBOR_EMULATOR_URL`` set, that server is used and nothing is started. Without
it, the client reuses the server recorded in the state file of the cache directory when that
process still answers, and otherwise starts one itself: detached (its own session, so it
outlives the client, as SkyPilot's API server does), on a port the kernel picks, logging to a
file beside the state file. A file lock makes concurrent clients start exactly one.

A server this process started is this process's to stop: ``stop_started_servers`` (what a
``HarborBackend`` shutdown calls, through the registry) stops it; a server it found running is
never touched. Another process that reused a stopped one starts a new one on its next call,
which finds the account's sandboxes again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_exponential

from osmosis_harbor import settings
from osmosis_harbor.errors import DockerSdkMissingError, SandboxUnavailableError
from osmosis_harbor.sandbox.emulator.errors import EmulatorStartError
from osmosis_harbor.sandbox.emulator.server.process import ServerState, read_state

__all__ = ["STATE_FILE", "check_reachable", "server_url", "stop_started_servers"]

STATE_FILE = "server.json"
START_TIMEOUT_SEC = 60.0
STOP_TIMEOUT_SEC = 15.0
LOG_TAIL_BYTES = 64 * 1024  # what of a failed start's log is read for its error
LOG_LINE_CHARS = 500
# The servers this process started, with their state files: the process owns its children.
_STARTED: dict[Path, subprocess.Popen[bytes]] = {}
_STARTED_LOCK = threading.Lock()


def server_url(current: settings.Settings) -> str:
    """The base URL of the emulator server this process talks to, by ``current`` (the client's
    reading of the settings for the call that connects)."""
    if current.emulator_url:
        return current.emulator_url.rstrip("/")
    return _ensure_local_server(current.emulator_dir())


def check_reachable(current: settings.Settings) -> None:
    """``sdk="skypilot-emulator"``'s preflight: the server named by ``OSMOSIS_HARBOR_EMULATOR_URL``
    answers; without it, the engine an on-demand server runs its sandboxes on does (nothing is
    started here: the first call starts the server, as SkyPilot's client starts its own)."""
    if not current.emulator_url:
        try:  # an on-demand server runs on docker-py: the extra
            from osmosis_harbor.sandbox.docker.engine import check_reachable as check_engine
        except ImportError as exc:
            raise DockerSdkMissingError(exc) from exc
        check_engine(current)
        return
    url = current.emulator_url.rstrip("/")
    try:
        answered = httpx.get(f"{url}/healthz", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        answered = False
    if not answered:
        raise SandboxUnavailableError(
            f"the skypilot-emulator server at {url} (OSMOSIS_HARBOR_EMULATOR_URL) does not answer: start it "
            "with 'python -m osmosis_harbor emulator', or unset the variable to have one started on demand"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _answers(state: ServerState) -> bool:
    """The recorded process is alive and it is the one listening at the URL."""
    try:
        os.kill(state.pid, 0)
        response = httpx.get(f"{state.url}/healthz", timeout=5.0)
        return response.status_code == 200 and response.json().get("pid") == state.pid
    except (OSError, httpx.HTTPError, ValueError):
        return False


def _ensure_local_server(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    state_file = directory / STATE_FILE
    with _locked(directory / "server.lock"):
        state = read_state(state_file)
        if state is not None and _answers(state):
            return state.url
        return _start(directory, state_file)


def _start(directory: Path, state_file: Path) -> str:
    log_path = directory / "server.log"
    state_file.unlink(missing_ok=True)
    with log_path.open("ab") as log_file:
        log_start = log_file.tell()  # the log is appended to: this start's lines begin here
        process = subprocess.Popen(
            [sys.executable, "-m", "osmosis_harbor", "emulator", "--port", "0", "--state-file", str(state_file)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=settings.child_environment(),
        )

    def ready() -> ServerState | None:
        if process.poll() is not None:
            cause = _first_error(log_path, log_start)
            raise EmulatorStartError(
                f"the skypilot-emulator server exited with {process.returncode}"
                + (f": {cause}" if cause else "")
                + f"; see {log_path}"
            )
        state = read_state(state_file)
        return state if state is not None and state.pid == process.pid and _answers(state) else None

    retrying = Retrying(
        retry=retry_if_result(lambda s: s is None),
        stop=stop_after_delay(START_TIMEOUT_SEC),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        retry_error_callback=lambda _: None,
    )
    state = retrying(ready)
    if state is None:
        process.kill()
        process.wait()
        raise EmulatorStartError(
            f"the skypilot-emulator server did not answer within {START_TIMEOUT_SEC:g}s; see {log_path}"
        )
    with _STARTED_LOCK:
        _STARTED[state_file] = process
    return state.url


def _first_error(log_path: Path, start: int) -> str:
    """What a server that exited at start said was wrong: its one-line ``error:`` (what the
    command line prints for our own errors, a missing ``[docker]`` extra among them), else the
    last line of its traceback. Empty when the log has neither."""
    try:
        with log_path.open("rb") as log:
            log.seek(start)
            text = log.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("error: ")), None)
    if error is not None:
        return error.removeprefix("error: ")[:LOG_LINE_CHARS]
    return lines[-1][:LOG_LINE_CHARS] if lines else ""


def stop_started_servers() -> list[str]:
    """Stop the servers this process started (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_SEC``);
    returns their URLs. A server it only reused is not touched."""
    with _STARTED_LOCK:
        started = list(_STARTED.items())
        _STARTED.clear()
    stopped = []
    for state_file, process in started:
        state = read_state(state_file)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_SEC)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if state is not None and state.pid == process.pid:
            stopped.append(state.url)
    return stopped
