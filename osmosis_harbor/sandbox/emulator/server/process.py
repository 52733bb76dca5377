"""Running the emulator: a loopback socket, uvicorn, the state file, and a real restart.

``python -m osmosis_harbor emulator --port P`` lands here. The socket is bound before uvicorn
starts, so ``--port 0`` works (the chosen port goes into the state file an on-demand client
waits for). A restart (``POST /admin/restart``) re-executes this very process with the same
port and knobs: the pid stays, every byte of memory goes, and the new server finds its
sandboxes again in the engine, which is what a restarted SkyPilot API server does.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError, DockerSdkMissingError
from osmosis_harbor.sandbox.emulator.wire import Knobs

__all__ = ["ServerState", "read_state", "serve"]

log = logging.getLogger(__name__)


MAX_PREDECESSORS = 32


class ServerState(BaseModel):
    """What an on-demand server writes once it listens: where it is and which process it is."""

    url: str
    pid: int
    # Earlier servers of this account (the same state file), newest first: a server started
    # after one died owns what that one made, as a SkyPilot account outlives its API server.
    predecessors: list[int] = []

    def successor_predecessors(self, pid: int) -> list[int]:
        """The predecessors of the server ``pid`` that replaces this one (a restart in place
        keeps the pid, and so the list)."""
        chain = self.predecessors if pid == self.pid else [self.pid, *self.predecessors]
        return chain[:MAX_PREDECESSORS]


def read_state(path: Path) -> ServerState | None:
    try:
        return ServerState.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _write_state(path: Path, state: ServerState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(state.model_dump_json())
    tmp.replace(path)


def _listen(host: str, port: int) -> socket.socket:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"the emulator listens on loopback only (127.0.0.1 or ::1), not {host!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(256)
    return sock


def _restart_argv(
    host: str, port: int, knobs: Knobs, registry: str, state_file: Path | None, secret_names: Sequence[str]
) -> list[str]:
    argv = [sys.executable, "-m", "osmosis_harbor", "emulator", "--host", host, "--port", str(port)]
    argv += ["--registry", registry, "--knobs-json", knobs.model_dump_json()]
    for name in secret_names:  # names only: the values stay in this process's environment
        argv += ["--secret", name]
    if state_file is not None:
        argv += ["--state-file", str(state_file)]
    return argv


def _startup_secrets(names: Sequence[str]) -> dict[str, str]:
    """``--secret NAME``: the value of NAME in this server's own environment."""
    values = {}
    for name in names:
        value = settings.host_variable(name)
        if value is None:
            raise ConfigError(f"--secret {name}: {name} is not set in the emulator server's environment")
        values[name] = value
    return values


def _require_docker_py() -> None:
    """The server runs its sandboxes on the local engine through docker-py: without the extra it
    stops with the one line that says what to install (an on-demand client quotes it from the
    log), not a traceback from deep in ``sandbox.docker``."""
    try:
        importlib.import_module("docker.errors")  # and so ``docker`` itself
    except ImportError as exc:
        raise DockerSdkMissingError(exc) from exc


def serve(
    host: str,
    port: int,
    knobs: Knobs,
    registry: str,
    state_file: Path | None = None,
    *,
    secret_names: Sequence[str] = (),
) -> None:
    """Serve until interrupted (or re-executed by a restart)."""
    # The server side needs the ``docker`` extra; clients import this module for ``read_state``.
    _require_docker_py()
    import uvicorn

    from osmosis_harbor.sandbox.docker import disable_auto_reap
    from osmosis_harbor.sandbox.emulator.server.app import build_app
    from osmosis_harbor.sandbox.emulator.server.faults import FaultInjector
    from osmosis_harbor.sandbox.emulator.server.state import Emulator

    sock = _listen(host, port)
    bound_port = int(sock.getsockname()[1])
    disable_auto_reap()  # one account on a shared engine: it reaps its own sandboxes only (reap_expired)
    previous = read_state(state_file) if state_file is not None else None
    predecessors = previous.successor_predecessors(os.getpid()) if previous is not None else []
    emulator = Emulator(knobs, registry, predecessors=predecessors, secrets=_startup_secrets(secret_names))
    injector = FaultInjector(knobs)

    def restart() -> None:
        argv = _restart_argv(host, bound_port, injector.knobs, registry, state_file, secret_names)
        log.warning("skypilot-emulator restarting (pid %d)", os.getpid())
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(argv[0], argv)

    app = build_app(emulator, injector, restart)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{bound_port}"
    if state_file is not None:
        _write_state(state_file, ServerState(url=url, pid=os.getpid(), predecessors=predecessors))
    print(json.dumps({"url": url, "pid": os.getpid()}), flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
