"""A scripted OpenAI-compatible chat-completions endpoint on 127.0.0.1.

For demos (``python -m osmosis_harbor rollout --scripted-reply ...``), tests and benchmarks:
a stand-in for the training cluster's policy endpoint. The reply is the one ``replies`` gives for
the last user message's exact text, else that message's ``reply:`` line when there is one (so each
rollout can script itself), else ``default_reply``. Every request is recorded (path,
Authorization header, body) so callers can assert what the sandbox sent. It listens on loopback
only.

``python -m osmosis_harbor.testing --port 8401 --replies FILE`` serves one (a JSON
object of user message to reply) until interrupted: a model for a harness, such as ``osmosis eval
run`` with ``OPENAI_BASE_URL=http://127.0.0.1:8401/v1``, on a machine without one.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class RecordedRequest:
    path: str
    authorization: str | None
    body: dict[str, Any]


@dataclass
class FakeChatServer:
    default_reply: str = "echo 42 > answer.txt"
    replies: dict[str, str] = field(default_factory=dict)  # the last user message's text -> reply
    port: int = 0  # 0: one the kernel picks
    # The address it listens on: the loopback, or a local bridge's gateway that containers on that
    # bridge reach (traffic that never leaves this machine).
    host: str = "127.0.0.1"
    # When set, requests without exactly this Authorization header get a 401, as a real
    # policy endpoint would answer a wrong key.
    required_authorization: str | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    # Seconds to wait before answering a chat body: a call slow because of its own parameters
    # (a huge ``max_tokens``, say), while the endpoint answers others at once.
    delay_for: Callable[[dict[str, Any]], float] | None = None
    # Chat calls answered before the endpoint goes down (its listener closed, so later
    # connections are refused); None: it never does.
    answers_left: int | None = None

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                server.requests.append(RecordedRequest(self.path, self.headers.get("Authorization"), body))
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                if server.required_authorization is not None and (
                    self.headers.get("Authorization") != server.required_authorization
                ):
                    self.send_response(401)
                    self.end_headers()
                    return
                if server.delay_for is not None and (delay := server.delay_for(body)) > 0:
                    time.sleep(delay)  # this handler's own thread: other calls are answered meanwhile
                reply = server.reply_for(body.get("messages") or [])
                payload = json.dumps(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "policy"),
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                server.answered_one()

            def log_message(self, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self._httpd.server_address[1]}/v1"

    def reply_for(self, messages: list[dict[str, Any]]) -> str:
        for message in reversed(messages):
            content = message.get("content")
            if message.get("role") == "user" and isinstance(content, str):
                if content in self.replies:
                    return self.replies[content]
                for line in content.splitlines():
                    if line.startswith("reply:"):
                        return line.removeprefix("reply:").strip()
                break
        return self.default_reply

    def answered_one(self) -> None:
        if self.answers_left is None:
            return
        self.answers_left -= 1
        if self.answers_left <= 0:
            self._httpd.shutdown()  # from a handler's thread: the serving loop is another's
            self._httpd.socket.close()  # down: connections are refused from now on

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m osmosis_harbor.testing", description=__doc__)
    parser.add_argument("--port", type=int, default=8401, help="port on 127.0.0.1 (default 8401)")
    parser.add_argument("--replies", type=Path, help="JSON object: a user message's exact text -> the reply")
    parser.add_argument("--default-reply", default="echo 42", help="the reply to any other message")
    args = parser.parse_args(argv)
    replies = json.loads(args.replies.read_text(encoding="utf-8")) if args.replies else {}
    server = FakeChatServer(default_reply=args.default_reply, replies=replies, port=args.port)
    print(f"scripted policy on {server.base_url} ({len(replies)} scripted replies); Ctrl-C stops it", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
