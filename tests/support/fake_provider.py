"""A local OpenAI-compatible chat endpoint with a scripted queue of behaviours.

Tests point litellm at it (``openai/fake-model`` with ``api_base=provider.api_base``) so the
gateway makes real HTTP calls over loopback and nothing else. Each request pops the next
behaviour; when the queue is empty the server answers ``ok``.

Behaviours: ``"ok"``, ``"rate_limited"`` (429, ``Retry-After: 1``), ``"server_error"`` (500),
``("slow", seconds)`` (sleep, then ok), ``"insufficient_quota"`` (429 with OpenAI's quota body),
``"unauthorized"`` (401), ``"bad_request"`` (400).

``latency`` adds a fixed delay to every answer (parallelism benches and tests); ``in_flight`` /
``max_in_flight`` count requests being answered at once (provider-limit tests);
``offline=True`` answers ``ok`` requests like ``local/keepstep-offline`` would (the offline
model's JSON for keepstep's own prompts), so a whole run can go through the server.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Behaviour = str | tuple[str, float]

OK_CONTENT = '{"answer": "fake"}'
PROMPT_TOKENS, COMPLETION_TOKENS = 11, 7


def _error_body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _completion_body(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        },
    }


class FakeProvider:
    """Threaded HTTP server on 127.0.0.1, port chosen by the OS."""

    def __init__(self, behaviours: Iterable[Behaviour] = (), *, content: str = OK_CONTENT,
                 latency: float = 0.0, offline: bool = False):
        self._queue: deque[Behaviour] = deque(behaviours)
        self._lock = threading.Lock()
        self.content = content
        self.latency = latency
        self.offline = offline
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: list[float] = []  # time.monotonic() of each request
        self.rate_limited = 0
        self.request_count = 0
        self.requests: list[dict[str, Any]] = []
        self.auth_headers: list[str | None] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown (and so each test's teardown) fast.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *behaviours: Behaviour) -> None:
        """Append behaviours to the queue."""
        with self._lock:
            self._queue.extend(behaviours)

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, body: dict[str, Any], auth: str | None) -> Behaviour:
        with self._lock:
            self.request_count += 1
            self.arrivals.append(time.monotonic())
            self.requests.append(body)
            self.auth_headers.append(auth)
            return self._queue.popleft() if self._queue else "ok"

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def content_for(self, body: dict[str, Any]) -> str:
        if not self.offline:
            return self.content
        from keepstep.engine.gateway.offline_provider import build_response_content

        return build_response_content(body.get("messages") or [])

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Without TCP_NODELAY a keep-alive answer waits ~40 ms for the delayed ACK.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest output clean

            def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
                      ) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, _error_body("not found", "invalid_request_error", None))
                    return
                behaviour = provider._next(body, self.headers.get("Authorization"))
                provider._enter()
                try:
                    if provider.latency:
                        time.sleep(provider.latency)
                    self._answer(behaviour, body)
                finally:
                    provider._leave()

            def _answer(self, behaviour: Behaviour, body: dict[str, Any]) -> None:
                model = str(body.get("model", "fake-model"))
                name, arg = behaviour if isinstance(behaviour, tuple) else (behaviour, 0.0)
                if name == "ok":
                    self._send(200, _completion_body(model, provider.content_for(body)))
                elif name == "slow":
                    time.sleep(arg)
                    self._send(200, _completion_body(model, provider.content_for(body)))
                elif name == "rate_limited":
                    with provider._lock:
                        provider.rate_limited += 1
                    self._send(429, _error_body("Rate limit reached for requests",
                                                "requests", "rate_limit_exceeded"),
                               {"Retry-After": "1"})
                elif name == "server_error":
                    self._send(500, _error_body("The server had an error", "server_error", None))
                elif name == "insufficient_quota":
                    self._send(429, _error_body(
                        "You exceeded your current quota, please check your plan and billing "
                        "details.", "insufficient_quota", "insufficient_quota"))
                elif name == "unauthorized":
                    self._send(401, _error_body(
                        "Incorrect API key provided: sk-fake************************1234.",
                        "invalid_request_error", "invalid_api_key"))
                elif name == "bad_request":
                    self._send(400, _error_body("Invalid 'messages' value",
                                                "invalid_request_error", None))
                else:
                    raise ValueError(f"unknown fake behaviour {behaviour!r}")

        return Handler


@contextmanager
def running_provider(*behaviours: Behaviour, content: str = OK_CONTENT, latency: float = 0.0,
                     offline: bool = False) -> Iterator[FakeProvider]:
    """Start a FakeProvider for the duration of a ``with`` block."""
    provider = FakeProvider(behaviours, content=content, latency=latency,
                            offline=offline).start()
    try:
        yield provider
    finally:
        provider.stop()
