"""A local model server that answers like a real model, for tests and benchmarks.

One threaded ``http.server`` on 127.0.0.1 (port chosen by the OS) with two faces:

- OpenAI-compatible ``POST /v1/chat/completions`` — point litellm at it with
  ``openai/gpt-4o-mini`` and ``api_base = server.api_base`` (a dummy key in the environment);
- Ollama-shaped ``POST /api/chat`` — ``ollama_chat/<name>`` with ``api_base = server.ollama_base``.

Every answer is what the offline model says for the received messages (it reads the prompt's
INPUT block like any model would), so the answers are right for the prompt; the mode decides
how the answer is *written*:

``clean``         the JSON object alone
``fenced``        inside a ```json fence
``prose``         a sentence of prose, then the JSON, then another sentence
``invalid_once``  the first answer to each task is prose without JSON; the revise round's is clean
``wrong_keys``    the top-level keys are renamed (evidence → items, ...) until a feedback message
                  names the right ones
``rate_limited``  the first request gets a 429 with Retry-After, then clean answers
``slow``          the first ``slow_requests`` answers wait ``slow_s`` seconds first
``mixed``         realistic formatting: clean, fenced and prose in turn; every ``every``-th answer
                  invalid (prose without JSON, wrong keys, or cut off with finish_reason
                  "length", in turn); one 429 at request ``rate_limit_at``

``rules`` override the mode for matching requests, like the fault suite's provider: each is
``{"match": {<INPUT key>: value, ...}, "do": <how>, "times": n or None}`` where ``how`` is one
of ``no_json``, ``wrong_keys``, ``cut_off``, ``rate_limited`` or ``slow``; the next ``times``
matching requests (every one for None) are answered that way. A rule with ``"vary": True``
makes each of its answers differ from the last (prose gets a remark naming the request's
number, JSON a layout of its own), like a sampling model's: a unit whose rejected answers
repeat byte for byte is not retried (issue 21).

Usage is reported like OpenAI (``prompt_tokens`` = ceil(prompt chars / 4), ``completion_tokens``
likewise), so litellm prices it. ``log`` keeps every request (path, model, messages,
response_format, format, options, max_tokens) with what was done; ``usage`` sums what was
reported for answers given; ``max_in_flight`` is the most requests served at once.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from keepstep.engine.gateway import offline_model
from keepstep.engine.gateway.prompts import message_text, read_input_block
from tests.support.http_json import JsonHandler, take_rule

MODES = ("clean", "fenced", "prose", "invalid_once", "wrong_keys", "rate_limited", "slow",
         "mixed")
WRONG_KEYS = {"evidence": "items", "results": "verdicts", "conflicts": "disputes",
              "claims": "findings", "summary": "overview", "risks": "ranked_risks",
              "problems": "issues", "sentences": "lines", "revisions": "changes",
              "verdicts": "judgements"}
NO_JSON = "I have read the input carefully. The statements are listed in my notes above."


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _task_key(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "user":
            return message_text(m.get("content"))
    return ""


def _feedback(messages: list[dict[str, Any]]) -> str:
    """The last user message when it follows an assistant message (a revise round)."""
    if len(messages) >= 3 and messages[-1].get("role") == "user" and any(
            m.get("role") == "assistant" for m in messages):
        return message_text(messages[-1].get("content"))
    return ""


class ModelServer:
    def __init__(self, mode: str = "clean", *, every: int = 9, rate_limit_at: int = 5,
                 retry_after_ms: int = 50, slow_s: float = 2.0, slow_requests: int = 1,
                 rules: list[dict[str, Any]] | tuple = ()) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        self.mode = mode
        self.every = every
        self.rate_limit_at = rate_limit_at
        self.retry_after_ms = retry_after_ms
        self.slow_s = slow_s
        self.slow_requests = slow_requests
        self.rules = [dict(r) for r in rules]
        self.log: list[dict[str, Any]] = []
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "answers": 0}
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._requests = itertools.count(1)
        self._answers = itertools.count(1)
        self._invalid_styles = itertools.cycle(("no_json", "wrong_keys", "cut_off"))
        self._styles = itertools.cycle(("clean", "fenced", "prose"))
        self._seen_tasks: set[str] = set()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    # -- addresses -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ollama_base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    # -- what the log says -----------------------------------------------------------------
    def answered(self) -> list[dict[str, Any]]:
        """Log entries of requests that got an answer (not a 429)."""
        return [e for e in self.log if e["status"] == 200]

    def feedback_texts(self) -> list[str]:
        return [e["feedback"] for e in self.log if e["feedback"]]

    # -- answering -------------------------------------------------------------------------
    def decide(self, messages: list[dict[str, Any]]) -> tuple[int, str, dict[str, Any]]:
        """(status, how, extra) for the next request: how the answer is written."""
        with self._lock:
            n = next(self._requests)
            feedback = _feedback(messages)
            task = _task_key(messages)
            first_ask = task not in self._seen_tasks
            self._seen_tasks.add(task)
            rule = take_rule(self.rules, read_input_block(messages) or {})
            if rule is not None:
                ruled = str(rule["do"])
                return (429 if ruled == "rate_limited" else 200), ruled, \
                    ({"sample": n} if rule.get("vary") else {})
            mode = self.mode
            if mode == "rate_limited" and n == 1 or mode == "mixed" and n == self.rate_limit_at:
                return 429, "rate_limited", {}
            if mode == "slow" and n <= self.slow_requests:
                return 200, "slow", {}
            if mode in ("fenced", "prose"):
                return 200, mode, {}
            if mode == "invalid_once":
                return 200, ("no_json" if first_ask and not feedback else "clean"), {}
            if mode == "wrong_keys":
                return 200, "wrong_keys", {}  # keys the feedback names come back right
            if mode == "mixed":
                a = next(self._answers)
                if a % self.every == 0 and not feedback:
                    return 200, next(self._invalid_styles), {}
                return 200, next(self._styles), {}
            return 200, "clean", {}

    def requests_for(self, **match: Any) -> list[dict[str, Any]]:
        """Log entries whose INPUT block matches ``match`` (e.g. task="extract")."""
        out = []
        for e in self.log:
            payload = read_input_block(e["messages"]) or {}
            if all(payload.get(k) == v for k, v in match.items()):
                out.append(e)
        return out

    def content(self, messages: list[dict[str, Any]], how: str) -> tuple[str, str]:
        """(content, finish_reason) written the way ``how`` says."""
        from keepstep.engine.gateway.offline_provider import build_response_content

        payload = read_input_block(messages)
        answer = json.loads(build_response_content(messages)) if payload is not None else {}
        text = json.dumps(answer, sort_keys=True, ensure_ascii=False)
        if how == "wrong_keys":
            feedback = _feedback(messages)
            renamed = {(k if k in feedback else WRONG_KEYS.get(k, k)): v
                       for k, v in answer.items()}
            return json.dumps(renamed, sort_keys=True), "stop"
        if how == "fenced":
            return f"```json\n{json.dumps(answer, indent=2, sort_keys=True)}\n```", "stop"
        if how == "prose":
            return (f"Here is the answer you asked for.\n\n{text}\n\nEvery item follows the "
                    "rules of evidence."), "stop"
        if how == "no_json":
            return NO_JSON, "stop"
        if how == "cut_off":
            return text[: max(1, len(text) // 2)], "length"
        return text, "stop"


def _sampled(content: str, n: int) -> str:
    """``content`` as the ``n``-th sample of a model: prose gets a different closing remark, a
    JSON object a different layout (the same keys and values)."""
    try:
        value = json.loads(content)
    except ValueError:
        return f"{content} (Draft {n}.)"
    return json.dumps(value, sort_keys=True, indent=n)


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:
            with server._lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                self._answer()
            finally:
                with server._lock:
                    server.in_flight -= 1

        def _answer(self) -> None:
            body = self.read_json()
            ollama = self.path.rstrip("/").endswith("/api/chat")
            messages = body.get("messages") or []
            status, how, extra = server.decide(messages)
            entry = {"path": self.path, "model": body.get("model"), "messages": messages,
                     "response_format": body.get("response_format"),
                     "format": body.get("format"), "options": body.get("options"),
                     "max_tokens": body.get("max_tokens"),
                     "temperature": body.get("temperature"), "how": how, "status": status,
                     "feedback": _feedback(messages),
                     "authorization": self.headers.get("Authorization"),
                     "received_at": time.time()}
            with server._lock:
                server.log.append(entry)
            if status == 429:
                self.send_json(429, {"error": {"message": "Rate limit reached for requests",
                                           "type": "requests", "param": None,
                                           "code": "rate_limit_exceeded"}},
                           {"Retry-After": "1", "retry-after-ms": str(server.retry_after_ms)})
                return
            if how == "slow":
                time.sleep(server.slow_s)
                how = "clean"
            try:
                content, finish = server.content(messages, how)
                if extra.get("sample"):  # a sampling model's answers differ call to call
                    content = _sampled(content, int(extra["sample"]))
            except Exception as exc:  # noqa: BLE001 - a prompt the offline model refuses
                self.send_json(400, {"error": {"message": str(exc), "type": "invalid_request_error",
                                           "param": None, "code": None}})
                return
            prompt_tokens = tokens("\n".join(message_text(m.get("content")) for m in messages))
            completion_tokens = tokens(content)
            with server._lock:
                server.usage["prompt_tokens"] += prompt_tokens
                server.usage["completion_tokens"] += completion_tokens
                server.usage["answers"] += 1
                entry.update(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
            model = str(body.get("model", "model"))
            if ollama:
                self.send_json(200, {"model": model, "created_at": "2026-01-01T00:00:00Z",
                                 "message": {"role": "assistant", "content": content},
                                 "done": True, "done_reason": finish,
                                 "prompt_eval_count": prompt_tokens,
                                 "eval_count": completion_tokens})
                return
            self.send_json(200, {
                "id": "chatcmpl-keepstep-test", "object": "chat.completion",
                "created": 1_700_000_000, "model": model,
                "choices": [{"index": 0, "finish_reason": finish,
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}})

    return Handler


@contextmanager
def running_server(mode: str = "clean", **kwargs: Any) -> Iterator[ModelServer]:
    server = ModelServer(mode, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()


__all__ = ["MODES", "WRONG_KEYS", "ModelServer", "offline_model", "running_server", "tokens"]
