"""A local webhook receiver for tests/test_effects.py (127.0.0.1 only, port 0).

It behaves like a well-behaved idempotent API: a POST is stored under its
``Idempotency-Key`` and applied once; a repeat with the same key returns the
first answer without applying again. ``applied[key]`` counts how many times
each action was really applied, which is what the tests assert on.
GET ``/hooks/<key>`` answers 200 (with the id), 404 (never seen) or 410
(deleted); DELETE ``/hooks/<key>`` undoes it. ``stop()`` and ``start()`` keep
the same port and the same records, like a server that went down and came back.
A delivered document (a POST that is not JSON) is recorded as the metadata its headers
carry; its bytes go to ``received`` (every POST's, duplicates included).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATH = "/hooks"


class WebhookServer:
    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.applied: Counter[str] = Counter()
        self.deleted: Counter[str] = Counter()
        self.posts = 0  # every POST, duplicates included
        self.received: list[bytes] = []  # every delivered document's bytes, duplicates too
        self.port = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{PATH}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> WebhookServer:
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        assert self._thread is not None
        self._thread.join(5)
        self._httpd = None

    # -- what the handler does, under one lock --------------------------------------
    def post(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.posts += 1
            rec = self.records.get(key)
            if rec is not None:
                return (410, {"error": "deleted"}) if rec["deleted"] else (200, {"id": rec["id"]})
            rec = {"id": f"evt-{len(self.records) + 1}", "body": body, "deleted": False}
            self.records[key] = rec
            self.applied[key] += 1
            return 201, {"id": rec["id"]}

    def get(self, key: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            rec = self.records.get(key)
            if rec is None:
                return 404, {"error": "unknown key"}
            if rec["deleted"]:
                return 410, {"error": "deleted"}
            return 200, {"id": rec["id"]}

    def delete(self, key: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            rec = self.records.get(key)
            if rec is None:
                return 404, {"error": "unknown key"}
            if not rec["deleted"]:
                rec["deleted"] = True
                self.deleted[key] += 1
            return 200, {"id": rec["id"], "deleted": True}


def _handler(server: WebhookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def _reply(self, status: int, data: dict[str, Any]) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _key(self) -> str | None:
            prefix = PATH + "/"
            return self.path[len(prefix):] if self.path.startswith(prefix) else None

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                body = json.loads(raw or b"{}")
            else:  # a delivered document: what the headers say about it; its bytes apart
                quoted = urllib.parse.unquote
                body = {"unit": quoted(self.headers.get("X-Keepstep-Unit") or ""),
                        "name": quoted(self.headers.get("X-Keepstep-Name") or ""),
                        "sha256": self.headers.get("X-Keepstep-Sha256"), "size": length,
                        "content_type": self.headers.get("Content-Type")}
                server.received.append(raw)
            key = self.headers.get("Idempotency-Key")
            if self.path != PATH or not key:
                self._reply(400, {"error": "POST /hooks with an Idempotency-Key header"})
                return
            self._reply(*server.post(key, body))

        def do_GET(self) -> None:
            key = self._key()
            self._reply(*(server.get(key) if key else (404, {"error": "no key"})))

        def do_DELETE(self) -> None:
            key = self._key()
            self._reply(*(server.delete(key) if key else (404, {"error": "no key"})))

    return Handler
