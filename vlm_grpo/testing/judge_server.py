"""A stand-in judge for tests and benchmarks: an OpenAI-compatible HTTP server on 127.0.0.1, in a thread.

It answers `GET /v1/models` and `POST /v1/chat/completions`. The reply to a request is `score(text)` of the text of
its last user message, by default its length modulo 11 (so a `{completion}` template gets a score in 0..10 that a
test can recompute from the completion). Each attempt at the same request body follows `plan` in turn (the last entry
repeats): `ok`, `slow` (answers after `slow_s`), `500`, `400`, `garbage` (a reply no parser reads) or `close`
(closes the connection without an answer). It records every request and the most it served at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GARBAGE = "I would rather not say."
"""The reply of a `garbage` attempt."""


def length_score(text: str) -> str:
    """The default reply: the text's length modulo 11."""
    return str(len(text) % 11)


def user_text(body: dict[str, Any]) -> str:
    """The text parts of the request's last user message."""
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part["type"] == "text")


class JudgeServer(ThreadingHTTPServer):
    """The server; its handler reads the settings below.

    Args:
        plan (`Sequence[str]`, *optional*, defaults to `("ok",)`): what the n-th attempt at a request body does.
        delay (`float`, *optional*, defaults to 0.0): seconds every answered request waits (a judge's latency).
        slow_s (`float`, *optional*, defaults to 2.0): seconds a `slow` attempt waits.
        score (`Callable[[str], str]`, *optional*, defaults to `length_score`): the reply to a user text.
        models (`Sequence[str]`, *optional*, defaults to `("judge",)`): the served model names.
    """

    daemon_threads = True
    request_queue_size = 256  # the listen backlog: many clients connect at once

    def __init__(
        self,
        plan: Sequence[str] = ("ok",),
        delay: float = 0.0,
        slow_s: float = 2.0,
        score: Callable[[str], str] = length_score,
        models: Sequence[str] = ("judge",),
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.plan, self.delay, self.slow_s, self.score, self.models = (
            list(plan),
            delay,
            slow_s,
            score,
            list(models),
        )
        self.lock = threading.Lock()
        self.attempts: Counter[bytes] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    @property
    def url(self) -> str:
        """The API's base URL, `http://127.0.0.1:PORT/v1`."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that timed out leaves the answer of a `slow` attempt nowhere to go."""

    def next_action(self, raw: bytes) -> str:
        with self.lock:
            self.attempts[raw] += 1
            self.requests.append(json.loads(raw))
            return self.plan[min(self.attempts[raw], len(self.plan)) - 1]


class _Handler(BaseHTTPRequestHandler):
    server: JudgeServer
    _counted = False  # this request is counted in the server's `in_flight`

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        self._release()  # answered: the client may send its next request as soon as it reads this
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(
                200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.server.models]}
            )
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        server = self.server
        action = server.next_action(raw)
        with server.lock:
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        self._counted = True
        try:
            self._answer(action, json.loads(raw))
        finally:
            self._release()

    def _release(self) -> None:
        """The request is no longer in flight (counted once, before its answer is written)."""
        if self._counted:
            with self.server.lock:
                self.server.in_flight -= 1
            self._counted = False

    def _answer(self, action: str, body: dict[str, Any]) -> None:
        if action == "close":
            self.close_connection = True
            self.connection.close()
            return
        if action in ("500", "400"):
            self._send(int(action), {"error": {"message": f"status {action}"}})
            return
        time.sleep(self.server.delay + (self.server.slow_s if action == "slow" else 0.0))
        text = GARBAGE if action == "garbage" else self.server.score(user_text(body))
        message = {"role": "assistant", "content": text}
        self._send(200, {"object": "chat.completion", "choices": [{"index": 0, "message": message}]})


@contextmanager
def judge_server(**settings: Any) -> Iterator[JudgeServer]:
    """A `JudgeServer(**settings)` serving in a thread while the context is open."""
    server = JudgeServer(**settings)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
