"""The JSON-over-HTTP plumbing the test servers share (fake_provider, model_server).

``JsonHandler`` answers HTTP/1.1 keep-alive with TCP_NODELAY (without it a keep-alive answer
waits ~40 ms for the delayed ACK), keeps pytest's output quiet, reads a request's JSON body
and sends a JSON answer, ignoring a client that already gave up. ``take_rule`` picks the
scripted rule a request's INPUT block matches.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    # An answer is held until this time.monotonic() (a server's fixed latency); 0: none.
    send_not_before = 0.0

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean

    def read_json(self) -> dict[str, Any]:
        """The request's JSON object ({} for an empty or unreadable body)."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def send_json(self, status: int, body: dict[str, Any],
                  headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        wait = self.send_not_before - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout, a killed worker)


def take_rule(rules: list[dict[str, Any]], payload: dict[str, Any]) -> dict[str, Any] | None:
    """The first rule whose ``match`` the payload satisfies and whose ``times`` (None: every
    time) is not used up; one use of it is counted. None when no rule applies."""
    for rule in rules:
        if any(payload.get(k) != v for k, v in rule["match"].items()):
            continue
        left = rule.get("times")
        if left is not None:
            if left <= 0:
                continue
            rule["times"] = left - 1
        return rule
    return None


__all__ = ["JsonHandler", "take_rule"]
