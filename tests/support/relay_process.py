"""A policy relay in a process of its own, so that its memory can be read from ``/proc``.

The child serves one token routed to a port nothing listens on (the held bodies under test never
reach an upstream) with the limits its environment gives; the parent reads the child's RSS and
asks it, over a pipe, for the relay's ``stats()``.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


def _serve(env: dict[str, str], conn: Connection) -> None:
    os.environ.update(env)
    from osmosis_harbor import settings
    from osmosis_harbor.sandbox.relay.policy_relay import PolicyRelay

    relay = PolicyRelay(config=settings.current())
    try:
        registration = relay.register_sync("http://127.0.0.1:9/v1")
        conn.send(registration.sandbox_url)
        while conn.recv() != "stop":
            conn.send(relay.stats())
    finally:
        relay.close()


class RelayProcess:
    """``with RelayProcess(env) as relay:`` then ``relay.url``, ``relay.stats()``, ``relay.rss_mib()``."""

    def __init__(self, env: dict[str, str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(env, child), daemon=True)
        self.url = ""

    def __enter__(self) -> RelayProcess:
        self._process.start()
        if not self._conn.poll(60):
            raise RuntimeError("the relay process did not start within 60 s")
        self.url = self._conn.recv()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._process.is_alive():
            self._conn.send("stop")
            self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)

    def stats(self) -> dict[str, int]:
        self._conn.send("stats")
        return self._conn.recv()

    def rss_mib(self) -> float:
        assert self._process.pid is not None
        for line in Path(f"/proc/{self._process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS line")
