"""The engine's requests over ``http.client`` (``sandbox/docker/lean_http.py``) give docker-py's
answers and errors, an exec's output and archives included, leave other streams on docker-py's
path, never send a request twice when a kept connection was closed, and fail as ``requests``
would when the engine is gone, silent, or breaks off a body. The engine's answers are compared
with a docker-py client without the lean transport on the same engine (the control)."""

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
    real_send, real_stream = handler._send, handler._send_stream
    handler._send = lambda method, url, kwargs: sent.append(f"{method} {url}") or real_send(method, url, kwargs)  # type: ignore[method-assign]
    handler._send_stream = lambda method, url, kwargs: (
        sent.append(f"{method} {url}") or real_stream(method, url, kwargs)
    )  # type: ignore[method-assign]
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

    script = "echo out; echo err >&2; head -c 300000 /dev/zero | tr '\\0' x; exit 3"
    outputs = []
    for client in (lean, plain):
        exec_id = client.exec_create(created["Id"], ["sh", "-c", script])["Id"]
        outputs.append(client.exec_start(exec_id, demux=True))  # the hijacked stream, framed
        assert client.exec_inspect(exec_id)["ExitCode"] == 3
    assert outputs[0] == outputs[1] and outputs[0][1] == b"err\n" and len(outputs[0][0]) == 4 + 300000
    for client in (lean, plain):  # read as it comes, as ExecRun drains it
        frames = client.exec_start(client.exec_create(created["Id"], ["seq", "3"])["Id"], stream=True, demux=True)
        assert b"".join(out for out, _ in frames if out) == b"1\n2\n3\n"
        frames.close()  # docker-py's CancellableStream shuts the socket, as ExecRun's drain does

    archives = []
    for client in (lean, plain):
        stream, stat = client.get_archive(created["Id"], "/etc/os-release")
        archives.append((b"".join(stream), stat))
    assert archives[0] == archives[1] and archives[0][0][:11] == b"os-release\0"

    for call in (
        lambda client: client.inspect_container("osmosis-lean-http-no-such"),
        lambda client: client.create_container(sandbox_image, labels=LABEL, name="osmosis-lean-http-probe"),
        lambda client: client.exec_create("osmosis-lean-http-no-such", ["true"]),
        lambda client: client.get_archive(created["Id"], "/no/such/path"),
        lambda client: client.exec_start("no-such-exec", demux=True),
    ):
        ours, theirs = _error(call, lean), _error(call, plain)
        assert type(ours) is type(theirs) and ours.status_code == theirs.status_code
        assert ours.explanation == theirs.explanation
    assert isinstance(_error(lambda: lean.inspect_container("osmosis-lean-http-no-such")), docker.errors.NotFound)

    lean.remove_container(created["Id"], force=True, v=True)
    assert isinstance(_error(lambda: plain.inspect_container(created["Id"])), docker.errors.NotFound)

    methods = {line.split()[0] for line in sent}
    assert {"GET", "POST", "DELETE"} <= methods  # the plain requests were the lean transport's
    assert any(line.startswith("POST") and line.endswith("/start") and "/exec/" in line for line in sent)
    assert any(line.startswith("GET") and line.endswith("/archive") for line in sent)  # the streams too


class _OneAnswerPerConnection(threading.Thread):
    """An HTTP server on a Unix socket that answers one request per connection, then closes it
    without saying so (no ``Connection: close``): a kept connection the engine dropped."""

    def __init__(self, path: Path, *, answer: bool = True, reply: bytes | None = None) -> None:
        super().__init__(daemon=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.answer = answer
        self.reply = reply  # instead of the JSON answer
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
                    self.reply
                    or b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
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


BROKEN_BODY = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nContent-Length: 100\r\n\r\n0123456789"


def test_an_archive_broken_off_mid_body_fails_as_with_docker_py(tmp_path: Path) -> None:
    """The engine dying while an archive streams: docker-py with ``requests`` raises
    ``ChunkedEncodingError`` from ``iter_content``; so does the lean transport."""
    path = tmp_path / "broken.sock"
    server = _OneAnswerPerConnection(path, reply=BROKEN_BODY)  # 10 of the 100 bytes announced
    server.start()
    raised = []
    try:
        for lean in (False, True):
            client = docker.APIClient(base_url=f"unix://{path}", version="1.41")
            if lean:
                assert install_lean_requests(client)
            response = client._get(client._url("/containers/{0}/archive", "c"), params={"path": "/x"}, stream=True)
            with pytest.raises(requests.exceptions.RequestException) as caught:
                b"".join(response.iter_content(4096))
            raised.append(type(caught.value))
            response.close()
            client.close()
    finally:
        server.close()
    assert raised == [requests.exceptions.ChunkedEncodingError] * 2


def test_other_streams_and_other_sockets_keep_docker_py_s_path(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    lean = LeanRequests(lambda method, url, **kwargs: seen.append((method, url)), str(tmp_path / "x.sock"), {})
    lean("POST", "http+docker://localhost/v1.41/images/create", stream=True, timeout=5)  # a pull's progress
    lean("GET", "http+docker://localhost/v1.41/containers/c/logs", stream=True, timeout=5)
    lean("GET", "https://registry.example/v2/", timeout=5)
    lean("POST", "http+docker://localhost/v1.41/x", data=iter([b"chunk"]), timeout=5)
    lean("GET", "http+docker://localhost/v1.41/x", timeout=(1, 5))
    assert [method for method, _ in seen] == ["POST", "GET", "GET", "POST", "GET"]
    assert LeanRequests._handles("http+docker://localhost/v1.41/containers/c/archive", {"stream": True})
    assert LeanRequests._handles("http+docker://localhost/v1.43/exec/e1/start", {"stream": True, "data": "{}"})


def test_the_setting_keeps_docker_py_s_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT=0`` reaches the engine through its config: docker-py's
    own ``request`` stays."""
    from osmosis_harbor import settings
    from osmosis_harbor.sandbox.docker.config import DockerConfig

    monkeypatch.setenv("OSMOSIS_HARBOR_LEAN_ENGINE_CLIENT", "0")
    config = DockerConfig.of(settings.current())
    client = docker.APIClient(version="auto")
    try:
        assert config.lean_engine_client is False
        assert not install_lean_requests(client, enabled=config.lean_engine_client)
        assert not isinstance(client.request, LeanRequests)
        assert install_lean_requests(client, enabled=True) == isinstance(client.request, LeanRequests)
    finally:
        client.close()
