"""A local OpenAI-compatible provider that answers like the offline model, with scripted faults.

Provider-fault cases point the project at it (``default_model = "openai/fake-model"``,
``api_base``) so the worker's calls go through litellm and real HTTP over loopback. Every
answer is what ``local/keepstep-offline`` would say, so the run can finish once the fault is
gone. A rule matches the request's JSON payload (``{"task": "extract", "source_id": "C1"}``)
and replaces the next ``times`` answers (``None``: every answer) with a fault:

``server_error`` (500), ``rate_limited`` (429 with ``Retry-After: 1``), ``insufficient_quota``
(429 with OpenAI's quota body), ``unauthorized`` (401), ``malformed`` (200, content that is
not JSON), ``check_fails`` (a claim check that always finds a problem).

The payload a rule matches is the prompt's INPUT block — what every model reads.

``answered`` counts the successful answers (the calls a real provider would charge for) per
``task:source`` — the fault cases compare it with the call ledger.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from keepstep.engine.gateway import offline_model
from keepstep.engine.gateway.offline_provider import build_response_content
from keepstep.engine.gateway.prompts import read_input_block

MODEL = "openai/fake-model"


def _key(payload: dict[str, Any]) -> str:
    return f"{payload.get('task')}:{payload.get('source_id', '')}"


class FaultProvider:
    def __init__(self, rules: list[dict[str, Any]] | tuple = ()) -> None:
        self.rules = [dict(r) for r in rules]
        self.answered: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> FaultProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def fault_for(self, payload: dict[str, Any]) -> str | None:
        with self._lock:
            for rule in self.rules:
                if any(payload.get(k) != v for k, v in rule["match"].items()):
                    continue
                left = rule.get("times")
                if left is not None:
                    if left <= 0:
                        continue
                    rule["times"] = left - 1
                self.faults[_key(payload)] += 1
                return str(rule["do"])
        return None

    def charge(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self.answered[_key(payload)] += 1


def _completion(model: str, content: str, prompt: str) -> dict[str, Any]:
    tokens_in, tokens_out = offline_model.count_tokens(prompt), offline_model.count_tokens(content)
    return {"id": "chatcmpl-fault-suite", "object": "chat.completion", "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                      "total_tokens": tokens_in + tokens_out}}


def _error(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _handler(provider: FaultProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: dict[str, Any],
                  headers: dict[str, str] | None = None) -> None:
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
                pass  # the worker was killed mid-call

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw or b"{}")
            messages = body.get("messages") or []
            prompt = "\n".join(str(m.get("content", "")) for m in messages)
            payload = read_input_block(messages) or {}
            model = str(body.get("model", "fake-model"))
            fault = provider.fault_for(payload)
            if fault == "server_error":
                self._send(500, _error("The server had an error", "server_error", None))
            elif fault == "rate_limited":
                self._send(429, _error("Rate limit reached for requests", "requests",
                                       "rate_limit_exceeded"), {"Retry-After": "1"})
            elif fault == "insufficient_quota":
                self._send(429, _error("You exceeded your current quota, please check your "
                                       "plan and billing details.", "insufficient_quota",
                                       "insufficient_quota"))
            elif fault == "unauthorized":
                self._send(401, _error("Incorrect API key provided: sk-fault************1234.",
                                       "invalid_request_error", "invalid_api_key"))
            elif fault == "malformed":
                provider.charge(payload)
                self._send(200, _completion(model, "Sure! Here is the evidence: <html>", prompt))
            else:
                content = build_response_content(messages)
                if fault == "check_fails":
                    answer = json.loads(content)
                    answer["problems"] = list(answer.get("problems") or []) + [
                        "R1 cites evidence that does not support its score (scripted)"]
                    content = json.dumps(answer, sort_keys=True)
                provider.charge(payload)
                self._send(200, _completion(model, content, prompt))

    return Handler
