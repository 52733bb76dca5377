"""The engine's plain requests over ``http.client`` (``sandbox/docker/lean_http.py``) give
docker-py's answers and errors, leave streams on docker-py's path, never send a request twice
when a kept connection was closed, and fail as ``requests`` would when the engine is gone or
silent. The engine's answers are compared with a docker-py client without the lean transport
on the same engine (the control)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests

from osmosis_harbor.sandbox.docker.lean_http import LeanRequests, install_lean_requests

LABEL = {"osmosis-harbor.test": "lean-http"}


@pytest.fixture
def clients() -> Iterator[tuple[docker.APIClient, docker.APIClient, list[str]]]:
    """(docker-py as shipped, the same with the lean transport, what the lean one sent itself)."""
    plain = docker.APIClient(version="auto")
    lean = docker.APIClient(version="auto")
    if not install_lean_requests(lean):
        pytest.skip("the engine is not on a Unix socket")
    sent: list[str] = []
    handler: LeanRequests = lean.request
    real_send = handler._send
    handler._send = lambda method, url, kwargs: sent.append(f"{method} {url}") or real_send(method, url, kwargs)  # type: ignore[method-assign]
    yield plain, lean, sent
    for client in (plain, lean):
        for container in client.containers(all=True, filters={"label": "osmosis-harbor.test=lean-http"}):
            client.remove_container(container["Id"], force=True, v=True)
        client.close()


def _error(call: Any, *args: Any) -> docker.errors.APIError:
    with pytest.raises(docker.errors.APIError) as caught:
        call(*args)
    return caught.value


def test_answers_and_errors_are_docker_py_s(
    clients: tuple[docker.APIClient, docker.APIClient, list[str]], sandbox_image: str
) -> None:
    plain, lean, sent = clients
    created = lean.create_container(sandbox_image, command="sleep 300", labels=LABEL, name="osmosis-lean-http-probe")
    lean.start(created["Id"])
    assert lean.inspect_container(created["Id"]) == plain.inspect_container(created["Id"])

    exec_id = lean.exec_create(created["Id"], ["sh", "-c", "echo out; echo err >&2; exit 3"])["Id"]
    assert lean.exec_start(exec_id, demux=True) == (b"out\n", b"err\n")  # a stream: docker-py's own path
    assert lean.exec_inspect(exec_id)["ExitCode"] == 3 == plain.exec_inspect(exec_id)["ExitCode"]

    for call in (
        lambda client: client.inspect_container("osmosis-lean-http-no-such"),
        lambda client: client.create_container(sandbox_image, labels=LABEL, name="osmosis-lean-http-probe"),
        lambda client: client.exec_create("osmosis-lean-http-no-such", ["true"]),
    ):
        ours, theirs = _error(call, lean), _error(call, plain)
        assert type(ours) is type(theirs) and ours.status_code == theirs.status_code
        assert ours.explanation == theirs.explanation
    assert isinstance(_error(lambda: lean.inspect_container("osmosis-lean-http-no-such")), docker.errors.NotFound)

    lean.remove_container(created["Id"], force=True, v=True)
    assert isinstance(_error(lambda: plain.inspect_container(created["Id"])), docker.errors.NotFound)

    methods = {line.split()[0] for line in sent}
    assert {"GET", "POST", "DELETE"} <= methods  # the plain requests were the lean transport's
    assert not any(f"/exec/{exec_id}/start" in line for line in sent)  # the stream was not


class _OneAnswerPerConnection(threading.Thread):
    """An HTTP server on a Unix socket that answers one request per connection, then closes it
    without saying so (no ``Connection: close``): a kept connection the engine dropped."""

    def __init__(self, path: Path, *, answer: bool = True) -> None:
        super().__init__(daemon=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.accepted = threading.Event()
        self.dropped = threading.Semaphore(0)  # one release per connection this server has closed

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self.accepted.set()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data.split(b"\r\n", 1)[0])
                if not self.answer:
                    conn.recv(1)  # holds the request unanswered until the client gives up
                    continue
                body = b'{"ok": true}'
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
            self.dropped.release()

    def close(self) -> None:
        self.listener.close()


def _lean_on(path: Path) -> LeanRequests:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fallback was used")

    return LeanRequests(never, str(path), {"User-Agent": "test"})


def test_a_dropped_kept_connection_is_made_again_and_no_request_is_sent_twice(tmp_path: Path) -> None:
    server = _OneAnswerPerConnection(tmp_path / "engine.sock")
    server.start()
    try:
        lean = _lean_on(tmp_path / "engine.sock")
        for path in ("/v1.41/first", "/v1.41/second", "/v1.41/third"):
            assert lean("GET", f"http+docker://localhost{path}", timeout=30).json() == {"ok": True}
            # the engine drops a kept connection while it is idle; a drop racing a request being
            # written fails that request (as with docker-py's pool), which is not what is tested here
            assert server.dropped.acquire(timeout=30)
        assert server.requests == [
            b"GET /v1.41/first HTTP/1.1",
            b"GET /v1.41/second HTTP/1.1",
            b"GET /v1.41/third HTTP/1.1",
        ]
        assert server.connections == 3  # each dropped connection was found and replaced, not written to
    finally:
        server.close()


def test_a_missing_engine_is_a_connection_error_and_a_silent_one_a_read_timeout(tmp_path: Path) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        _lean_on(tmp_path / "absent.sock")("GET", "http+docker://localhost/v1.41/info", timeout=5)

    server = _OneAnswerPerConnection(tmp_path / "silent.sock", answer=False)
    server.start()
    try:
        with pytest.raises(requests.exceptions.ReadTimeout):
            _lean_on(tmp_path / "silent.sock")("GET", "http+docker://localhost/v1.41/info", timeout=0.2)
        assert server.requests == [b"GET /v1.41/info HTTP/1.1"]  # it was sent, once
    finally:
        server.close()


def test_streams_and_other_sockets_keep_docker_py_s_path(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    lean = LeanRequests(lambda method, url, **kwargs: seen.append((method, url)), str(tmp_path / "x.sock"), {})
    lean("GET", "http+docker://localhost/v1.41/containers/c/archive", stream=True, timeout=5)
    lean("GET", "https://registry.example/v2/", timeout=5)
    lean("POST", "http+docker://localhost/v1.41/x", data=iter([b"chunk"]), timeout=5)
    lean("GET", "http+docker://localhost/v1.41/x", timeout=(1, 5))
    assert [method for method, _ in seen] == ["GET", "GET", "POST", "GET"]
