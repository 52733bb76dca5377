"""git's smart HTTP protocol over TLS on 127.0.0.1 (``git http-backend`` behind a small handler),
serving the bare repositories under a directory with a certificate for 127.0.0.1, ``localhost``
and ``pinned.invalid``; every request path is recorded. ``/moved/<path>`` answers a redirect to
``/<path>``. Test traffic only: it listens on loopback and trusts nothing it is sent.
"""

from __future__ import annotations

import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PINNED_NAME = "pinned.invalid"  # resolves nowhere: only a pin can lead git to this server


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, localhost and ``PINNED_NAME``, made with openssl."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
         "-addext", f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{PINNED_NAME}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class SmartGitServer:
    """``url`` is ``https://127.0.0.1:<port>``; ``requests`` the paths asked for, in order."""

    def __init__(self, root: Path, cert: Path, key: Path) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._serve()

            def do_POST(self) -> None:  # noqa: N802
                self._serve()

            def _serve(self) -> None:
                outer.requests.append(self.path)
                if self.path.startswith("/moved/"):
                    self.send_response(301)
                    self.send_header("Location", f"{outer.url}/{self.path.removeprefix('/moved/')}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {
                    "GIT_PROJECT_ROOT": str(root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type") or "",
                    "CONTENT_LENGTH": str(len(body)),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding") or "",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol") or "",
                    "REMOTE_ADDR": "127.0.0.1",
                }
                done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                headers = [line.split(":", 1) for line in head.decode("latin-1").split("\r\n") if ":" in line]
                status = next((v.strip() for k, v in headers if k.lower() == "status"), "200 OK")
                self.send_response(int(status.split()[0]))
                for name, value in headers:
                    if name.lower() != "status":
                        self.send_header(name, value.strip())
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
