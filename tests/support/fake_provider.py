"""The local OpenAI-compatible chat endpoint of the engine and fault tests.

Tests point litellm at it (``openai/fake-model`` with ``api_base=provider.api_base``) so the
gateway makes real HTTP calls over loopback and nothing else. What a request gets:

- a **rule** first (``rules``): a rule matches the prompt's INPUT block (``{"match": {"task":
  "extract", "source_id": "C1"}, "do": "server_error", "times": 1}``; ``times`` None: every
  time) — the fault cases script one unit's calls this way;
- else the next **behaviour** of the queue (``behaviours``, ``script``); an empty queue
  answers ``ok``.

Behaviours and rule actions: ``"ok"``, ``"rate_limited"`` (429, ``Retry-After: 1``;
``("rate_limited", N)``: ``Retry-After: N``), ``"reset"`` (the connection dropped),
``"server_error"`` (500), ``("slow", seconds)`` (sleep, then ok), ``"insufficient_quota"``
(429 with OpenAI's quota body), ``"unauthorized"`` (401), ``"bad_request"`` (400),
``"malformed"`` (200, content that is not JSON), ``"check_fails"`` (the offline answer with
one more claim-check problem).

``answered`` counts the answers a real provider would charge for, per ``task:source_id``
(the fault cases compare it with the call ledger); ``faults`` the rule hits.

``latency``: every answer leaves that long after its request came in (however long the offline
answer took to compute: parallelism benches and tests); ``in_flight`` /
``max_in_flight`` count requests being answered at once (provider-limit tests);
``offline=True`` answers ``ok`` requests like ``local/keepstep-offline`` would (the offline
model's JSON for keepstep's own prompts), so a whole run can go through the server.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.http_json import JsonHandler, take_rule

Behaviour = str | tuple[str, float]
MODEL = "openai/fake-model"

OK_CONTENT = '{"answer": "fake"}'
PROMPT_TOKENS, COMPLETION_TOKENS = 11, 7


def _input_of(body: dict[str, Any]) -> dict[str, Any]:
    """The prompt's INPUT block (what every model reads), {} when there is none."""
    from keepstep.engine.gateway.prompts import read_input_block

    return read_input_block(body.get("messages") or []) or {}


def _key(payload: dict[str, Any]) -> str:
    return f"{payload.get('task')}:{payload.get('source_id', '')}"


def _error_body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _completion_body(model: str, content: str, body: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """A chat completion; usage counted like the offline model when the request is given,
    else the fixed small figures."""
    prompt_tokens, completion_tokens = PROMPT_TOKENS, COMPLETION_TOKENS
    if body is not None:
        from keepstep.engine.gateway.offline_model import count_tokens

        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages") or [])
        prompt_tokens, completion_tokens = count_tokens(prompt), count_tokens(content)
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
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class FakeProvider:
    """Threaded HTTP server on 127.0.0.1, port chosen by the OS."""

    def __init__(self, behaviours: Iterable[Behaviour] = (), *, content: str = OK_CONTENT,
                 latency: float = 0.0, offline: bool = False,
                 rules: Iterable[dict[str, Any]] = ()):
        self._queue: deque[Behaviour] = deque(behaviours)
        self.rules = [dict(r) for r in rules]
        self.answered: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
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
        payload = _input_of(body)
        with self._lock:
            self.request_count += 1
            self.arrivals.append(time.monotonic())
            self.requests.append(body)
            self.auth_headers.append(auth)
            rule = take_rule(self.rules, payload)
            if rule is not None:
                self.faults[_key(payload)] += 1
                return str(rule["do"])
            return self._queue.popleft() if self._queue else "ok"

    def _charge(self, body: dict[str, Any]) -> None:
        with self._lock:
            self.answered[_key(_input_of(body))] += 1

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

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                # /stats: what a provider in another process reports (bench/parallel.py);
                # ?reset=1 starts the in-flight peak again.
                if not self.path.startswith("/stats"):
                    self.send_json(404, _error_body("not found", "invalid_request_error", None))
                    return
                with provider._lock:
                    stats = {"in_flight": provider.in_flight,
                             "max_in_flight": provider.max_in_flight,
                             "requests": provider.request_count}
                    if "reset=1" in self.path:
                        provider.max_in_flight = provider.in_flight
                self.send_json(200, stats)

            def do_POST(self) -> None:
                body = self.read_json()
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_json(404, _error_body("not found", "invalid_request_error", None))
                    return
                behaviour = provider._next(body, self.headers.get("Authorization"))
                provider._enter()
                try:
                    # The answer leaves ``latency`` after the request came in, however long
                    # the offline answer took to compute (a server's fixed latency).
                    self.send_not_before = time.monotonic() + provider.latency
                    self._answer(behaviour, body)
                finally:
                    provider._leave()

            def _answer(self, behaviour: Behaviour, body: dict[str, Any]) -> None:
                model = str(body.get("model", "fake-model"))
                name, arg = behaviour if isinstance(behaviour, tuple) else (behaviour, 0.0)
                if name in ("ok", "slow", "malformed", "check_fails"):
                    if name == "slow":
                        time.sleep(arg)
                    content = provider.content_for(body)
                    if name == "malformed":
                        content = "Sure! Here is the evidence: <html>"
                    elif name == "check_fails":
                        answer = json.loads(content)
                        answer["problems"] = list(answer.get("problems") or []) + [
                            "R1 cites evidence that does not support its score (scripted)"]
                        content = json.dumps(answer, sort_keys=True)
                    provider._charge(body)
                    # Offline answers carry offline-model token counts, like a real run.
                    self.send_json(200, _completion_body(model, content,
                                                     body if provider.offline else None))
                elif name == "rate_limited":
                    with provider._lock:
                        provider.rate_limited += 1
                    self.send_json(429, _error_body("Rate limit reached for requests",
                                                "requests", "rate_limit_exceeded"),
                               {"Retry-After": str(int(arg) or 1)})
                elif name == "reset":  # the connection dropped, no answer at all
                    import socket

                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                elif name == "server_error":
                    self.send_json(500, _error_body("The server had an error", "server_error",
                                                    None))
                elif name == "insufficient_quota":
                    self.send_json(429, _error_body(
                        "You exceeded your current quota, please check your plan and billing "
                        "details.", "insufficient_quota", "insufficient_quota"))
                elif name == "unauthorized":
                    self.send_json(401, _error_body(
                        "Incorrect API key provided: sk-fake************************1234.",
                        "invalid_request_error", "invalid_api_key"))
                elif name == "bad_request":
                    self.send_json(400, _error_body("Invalid 'messages' value",
                                                "invalid_request_error", None))
                else:
                    raise ValueError(f"unknown fake behaviour {behaviour!r}")

        return Handler


@contextmanager
def running_provider(*behaviours: Behaviour, content: str = OK_CONTENT, latency: float = 0.0,
                     offline: bool = False, rules: Iterable[dict[str, Any]] = ()
                     ) -> Iterator[FakeProvider]:
    """Start a FakeProvider for the duration of a ``with`` block."""
    provider = FakeProvider(behaviours, content=content, latency=latency, offline=offline,
                            rules=rules).start()
    try:
        yield provider
    finally:
        provider.stop()


class ProviderProcess:
    """A FakeProvider in a process of its own (``python -m tests.support.fake_provider``): its
    answers then cost the engine's process no interpreter time, as a real server's would."""

    def __init__(self, proc: subprocess.Popen[str], api_base: str) -> None:
        self.proc, self.api_base = proc, api_base

    def stats(self, *, reset: bool = False) -> dict[str, int]:
        import urllib.request

        url = self.api_base.rsplit("/v1", 1)[0] + "/stats" + ("?reset=1" if reset else "")
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - loopback
            return dict(json.loads(answer.read()))


@contextmanager
def provider_process(*, latency: float = 0.0, offline: bool = False
                     ) -> Iterator[ProviderProcess]:
    """Start a FakeProvider in a child process for the duration of a ``with`` block."""
    import os
    import sys

    args = [sys.executable, "-m", "tests.support.fake_provider", "--latency", str(latency)]
    if offline:
        args.append("--offline")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, cwd=root)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"the provider process did not start: {line!r}")
        yield ProviderProcess(proc, line)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the child serves until its stdin closes
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="keepstep's fake OpenAI-compatible provider")
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--offline", action="store_true")
    args = ap.parse_args(argv)
    if args.offline:
        # The offline model's modules load before the first request, not during it.
        import keepstep.engine.gateway.offline_provider  # noqa: F401
    provider = FakeProvider(latency=args.latency, offline=args.offline).start()
    print(provider.api_base, flush=True)
    try:
        sys.stdin.read()  # until the parent closes it (or exits)
    finally:
        provider.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_serve())
