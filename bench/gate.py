"""A gate the scale benchmark's workflows wait at: each workflow's command is an HTTP GET
that the gate holds until it is opened.

Why: to measure N rollouts in flight at once, every one must still be waiting when the last
one starts, however long the ramp takes on a loaded machine; a fixed ``sleep`` would either
end too early or waste minutes. The gate counts arrivals (a workflow running in its
sandbox), holds them, and records when each arrived, so the benchmark can subtract the
waiting from the server's CPU. It lives in the benchmark's process, never in the measured
server's.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from osmosis_harbor.sandbox.docker.engine import sandbox_network

HOLD_LIMIT_SEC = 1800.0


class Gate:
    """``GET /gate`` blocks until ``open()``; ``arrivals`` holds each arrival's monotonic time."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.opened_at: float | None = None
        self._open = threading.Event()
        self._changed = threading.Condition()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                with gate._changed:
                    gate.arrivals.append(time.monotonic())
                    gate._changed.notify_all()
                gate._open.wait(HOLD_LIMIT_SEC)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"go")

            def log_message(self, *args: Any) -> None:
                pass

        # Sandboxes reach nothing on the host's loopback (the policy relay aside): the gate listens
        # on their bridge's gateway, which they reach like the relay.
        self._host = sandbox_network().gateway
        self._httpd = ThreadingHTTPServer((self._host, 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.request_queue_size = 1024
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def command(self) -> str:
        """The workflow's shell command (one line: the scripted policy replies with it)."""
        url = f"http://{self._host}:{self._httpd.server_address[1]}/gate"
        return f"python3 -c \"import urllib.request as u; u.urlopen('{url}', timeout={HOLD_LIMIT_SEC:.0f}).read()\""

    def wait_arrivals(self, n: int, timeout: float) -> int:
        """Block until ``n`` have arrived or ``timeout`` passes; returns how many arrived."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.arrivals) < n and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(min(left, 1.0))
            return len(self.arrivals)

    def open(self) -> None:
        self.opened_at = time.monotonic()
        self._open.set()

    def waiting_seconds(self) -> float:
        """Sum over arrivals of the time each waited at the gate (until it opened)."""
        end = self.opened_at if self.opened_at is not None else time.monotonic()
        return sum(max(0.0, end - t) for t in self.arrivals)

    def close(self) -> None:
        self.open()
        self._httpd.shutdown()
        self._httpd.server_close()
