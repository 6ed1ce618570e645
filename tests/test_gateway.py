"""Pins the model gateway: ledger rows per attempt, classification, retries, offline model.

Provider tests make real litellm calls to tests/support/fake_provider.py over loopback; sleeping is
injected, so retries cost no wall time.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")

import hashlib
import json
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from keepstep.engine.errors import (
    AuthError,
    BudgetExhausted,
    InvalidOutput,
    MissingKeyError,
    PermanentModelError,
    QuotaExhausted,
    RateLimited,
    RunCancelled,
    TransientModelError,
    UnknownModelError,
)
from keepstep.engine.gateway import client as gateway
from keepstep.engine.gateway.client import (
    CallContext,
    ModelGateway,
    ModelRequest,
    RetryPolicy,
)
from keepstep.engine.gateway.offline_model import HEURISTIC_NOTICE, count_tokens
from keepstep.engine.gateway.prompts import input_block
from tests.support.fake_provider import (
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    FakeProvider,
    running_provider,
)

DUMMY_KEY = "sk-test-DUMMY0123456789abcdef"
CTX = CallContext(run_id="run-1", unit="extract", attempt="a1")


class MemoryLedger:
    """In-memory CallLedger: one row per reserve, filled in by settle."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.rows: list[dict[str, Any]] = []
        self.refuse = refuse
        self._lock = threading.Lock()

    def reserve(self, ctx: CallContext, *, model: str, request_hash: str, est_tokens: int) -> str:
        if self.refuse:
            raise BudgetExhausted("model call budget used up", figures={"calls": 10, "limit": 10})
        with self._lock:
            call_id = f"call-{len(self.rows) + 1}"
            self.rows.append({"call_id": call_id, "ctx": ctx, "model": model,
                              "request_hash": request_hash, "est_tokens": est_tokens,
                              "outcome": None})
        return call_id

    def settle(self, call_id: str, **fields: Any) -> None:
        row = next(r for r in self.rows if r["call_id"] == call_id)
        assert row["outcome"] is None, "a row is settled once"
        row.update(fields)

    @property
    def outcomes(self) -> list[str | None]:
        return [r["outcome"] for r in self.rows]


class Sleeps(list):
    """A fake sleep that records its arguments."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def ledger() -> MemoryLedger:
    return MemoryLedger()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with running_provider() as p:
        yield p


def make_gateway(ledger: MemoryLedger, sleeps: Sleeps, **kwargs: Any) -> ModelGateway:
    kwargs.setdefault("api_key_lookup", lambda provider: DUMMY_KEY)
    return ModelGateway(ledger=ledger, sleep=sleeps, rng=random.Random(7), **kwargs)


def fake_request(provider: FakeProvider, **kwargs: Any) -> ModelRequest:
    kwargs.setdefault("messages", [{"role": "user", "content": "hello"}])
    return ModelRequest(model="openai/fake-model", api_base=provider.api_base, **kwargs)


# --- retries and classification over real HTTP -------------------------------------------

def test_rate_limited_then_ok_retries_after_retry_after(provider, ledger, sleeps):
    """429 with Retry-After then 200: one result, rows rate_limited+ok, slept >= Retry-After."""
    provider.script("rate_limited", "ok")
    result = make_gateway(ledger, sleeps).complete(CTX, fake_request(provider))
    assert result.content == '{"answer": "fake"}'
    assert (result.tokens_in, result.tokens_out) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    assert result.retries == 1
    assert result.cost == 0.0  # fake-model has no price in litellm's map
    assert ledger.outcomes == ["rate_limited", "ok"]
    assert ledger.rows[0]["error_class"] == "RateLimited"
    assert len(sleeps) == 1 and sleeps[0] >= 1.0
    assert provider.request_count == 2


def test_retry_after_is_capped_at_max_delay(provider, ledger, sleeps):
    """A Retry-After longer than the policy's max_delay_s is cut to max_delay_s."""
    provider.script("rate_limited", "ok")
    gw = make_gateway(ledger, sleeps, policy=RetryPolicy(max_delay_s=0.25))
    gw.complete(CTX, fake_request(provider))
    assert sleeps == [0.25]


def test_server_errors_are_retried_with_growing_backoff(provider, ledger, sleeps):
    """500, 500, 200: success on the third attempt, three rows, backoff grows."""
    provider.script("server_error", "server_error", "ok")
    result = make_gateway(ledger, sleeps).complete(CTX, fake_request(provider))
    assert result.retries == 2
    assert ledger.outcomes == ["transient", "transient", "ok"]
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] > 0


def test_persistent_server_errors_raise_after_max_attempts(provider, ledger, sleeps):
    """500 on every attempt: TransientModelError after exactly max_attempts rows and requests."""
    provider.script(*["server_error"] * 10)
    gw = make_gateway(ledger, sleeps, policy=RetryPolicy(max_attempts=3))
    with pytest.raises(TransientModelError) as caught:
        gw.complete(CTX, fake_request(provider))
    assert "HTTP 500" in str(caught.value)
    assert ledger.outcomes == ["transient"] * 3
    assert provider.request_count == 3
    assert len(sleeps) == 2


def test_slow_response_past_timeout_is_transient(provider, ledger, sleeps):
    """A response slower than timeout_s is a transient error (and would be retried)."""
    provider.script(("slow", 0.5))
    gw = make_gateway(ledger, sleeps, policy=RetryPolicy(max_attempts=1))
    with pytest.raises(TransientModelError, match="timed out"):
        gw.complete(CTX, fake_request(provider, timeout_s=0.2))
    assert ledger.outcomes == ["transient"]


def test_insufficient_quota_is_not_retried(provider, ledger, sleeps):
    """429 insufficient_quota: QuotaExhausted at once, one row, one request, no sleep."""
    provider.script("insufficient_quota")
    with pytest.raises(QuotaExhausted) as caught:
        make_gateway(ledger, sleeps).complete(CTX, fake_request(provider))
    assert "top it up" in str(caught.value)
    assert ledger.outcomes == ["quota_exhausted"]
    assert provider.request_count == 1
    assert sleeps == []


def test_unauthorized_is_auth_error_with_scrubbed_message(provider, ledger, sleeps):
    """401: AuthError, not retried; neither the error nor the ledger shows a key."""
    provider.script("unauthorized")
    with pytest.raises(AuthError) as caught:
        make_gateway(ledger, sleeps).complete(CTX, fake_request(provider))
    assert ledger.outcomes == ["auth"]
    assert provider.request_count == 1
    message = str(caught.value)
    assert "keepstep keys set" in message
    assert "sk-fake*" not in message and "1234" not in message
    assert "sk-fake*" not in ledger.rows[0]["safe_message"]


def test_bad_request_is_permanent_and_not_retried(provider, ledger, sleeps):
    """400: PermanentModelError after one attempt."""
    provider.script("bad_request")
    with pytest.raises(PermanentModelError, match="HTTP 400"):
        make_gateway(ledger, sleeps).complete(CTX, fake_request(provider))
    assert ledger.outcomes == ["permanent"]
    assert provider.request_count == 1


def test_budget_refusal_means_provider_is_never_called(provider, sleeps):
    """BudgetExhausted from reserve propagates and the provider sees no request."""
    refusing = MemoryLedger(refuse=True)
    with pytest.raises(BudgetExhausted):
        make_gateway(refusing, sleeps).complete(CTX, fake_request(provider))
    assert provider.request_count == 0


def test_key_is_sent_to_provider_but_never_recorded(provider, ledger, sleeps):
    """The resolved key goes in the Authorization header and nowhere in the ledger or result."""
    result = make_gateway(ledger, sleeps).complete(CTX, fake_request(provider))
    assert provider.auth_headers == [f"Bearer {DUMMY_KEY}"]
    assert DUMMY_KEY not in repr(ledger.rows) + result.model_dump_json()


def test_local_api_base_works_without_a_key(provider, ledger, sleeps):
    """An OpenAI-compatible server on loopback needs no key: the call succeeds without one."""
    gw = make_gateway(ledger, sleeps, api_key_lookup=lambda p: None)
    assert gw.complete(CTX, fake_request(provider)).content
    assert ledger.outcomes == ["ok"]


def test_missing_key_raises_before_any_ledger_row(ledger, sleeps):
    """A remote provider with no key: MissingKeyError naming the fix, and no ledger row."""
    gw = make_gateway(ledger, sleeps, api_key_lookup=lambda p: None)
    request = ModelRequest(model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(MissingKeyError, match="keepstep keys set openai"):
        gw.complete(CTX, request)
    assert ledger.rows == []


def test_unparseable_json_is_invalid_output_and_not_retried(ledger, sleeps):
    """expect_json with prose content: InvalidOutput, one row with its tokens, no retry."""
    with running_provider(content="Sure! Here is the answer.") as p:
        with pytest.raises(InvalidOutput):
            make_gateway(ledger, sleeps).complete(CTX, fake_request(p, expect_json=True))
        assert p.request_count == 1
    assert ledger.outcomes == ["invalid_output"]
    assert ledger.rows[0]["tokens_in"] == PROMPT_TOKENS


def test_fenced_json_counts_as_json(ledger, sleeps):
    """expect_json accepts JSON inside a Markdown code fence; parse_json_content reads it."""
    with running_provider(content='```json\n{"a": 1}\n```') as p:
        result = make_gateway(ledger, sleeps).complete(CTX, fake_request(p, expect_json=True))
    assert gateway.parse_json_content(result.content) == {"a": 1}


def test_cancellation_between_retries_raises_run_cancelled(provider, ledger):
    """A cancel requested during a backoff stops the call before the next attempt."""
    provider.script("server_error", "ok")
    cancel = threading.Event()
    gw = ModelGateway(ledger=ledger, sleep=lambda s: cancel.set(), rng=random.Random(1),
                      api_key_lookup=lambda p: DUMMY_KEY, cancel_event=cancel)
    with pytest.raises(RunCancelled):
        gw.complete(CTX, fake_request(provider))
    assert provider.request_count == 1
    assert ledger.outcomes == ["transient"]


def test_litellm_is_told_not_to_retry(ledger, sleeps):
    """Every call passes max_retries=0 and num_retries=0: the gateway owns retries."""
    seen: list[dict[str, Any]] = []

    def completion(**kwargs: Any) -> dict[str, Any]:
        seen.append(kwargs)
        return {"choices": [{"message": {"content": "hi"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1}}

    gw = make_gateway(ledger, sleeps, completion_fn=completion)
    gw.complete(CTX, ModelRequest(model="openai/gpt-4o-mini",
                                  messages=[{"role": "user", "content": "x"}]))
    assert seen[0]["max_retries"] == 0 and seen[0]["num_retries"] == 0
    assert seen[0]["api_key"] == DUMMY_KEY


# --- the offline default model -----------------------------------------------------------

def test_offline_model_end_to_end(ledger, sleeps):
    """local/keepstep-offline answers through litellm with the heuristic notice, at zero cost."""
    payload = {"task": "summarise", "text": "The market grew 5% in 2023. Prices rose by 3%."}
    messages = [{"role": "user", "content": input_block(payload)}]
    gw = ModelGateway(ledger=ledger, sleep=sleeps, api_key_lookup=lambda p: None)
    result = gw.complete(CTX, ModelRequest(model=gateway.OFFLINE_MODEL, messages=messages,
                                           expect_json=True))
    answer = json.loads(result.content)
    assert answer["notice"] == HEURISTIC_NOTICE
    assert result.content == json.dumps(answer, sort_keys=True, ensure_ascii=False)
    assert result.cost == 0.0
    assert result.tokens_out == count_tokens(result.content)
    assert result.tokens_in == count_tokens(messages[0]["content"])
    assert ledger.outcomes == ["ok"]


def test_offline_model_bad_payload_is_permanent(ledger, sleeps):
    """A payload the offline model rejects is a permanent error, not retried."""
    gw = ModelGateway(ledger=ledger, sleep=sleeps, api_key_lookup=lambda p: None)
    request = ModelRequest(model=gateway.OFFLINE_MODEL,
                           messages=[{"role": "user", "content": input_block({"task": "nope"})}])
    with pytest.raises(PermanentModelError, match="unknown task"):
        gw.complete(CTX, request)
    assert ledger.outcomes == ["permanent"]
    assert sleeps == []


# --- pure functions ----------------------------------------------------------------------

def test_importing_gateway_loads_neither_litellm_nor_textual():
    """The gateway module imports litellm lazily, and the engine never loads textual."""
    code = ("import sys, keepstep.engine.gateway.client, keepstep.engine.gateway.keys, "
            "keepstep.engine.gateway.offline_provider; "
            "print(sorted(m for m in ('litellm', 'textual', 'keyring') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_request_hash_is_stable_and_ignores_endpoint_and_key(monkeypatch):
    """Same model/messages/temperature/max_tokens → same hash, whatever the api_base or key."""
    base: dict[str, Any] = {"model": "openai/gpt-4o-mini",
                            "messages": [{"role": "user", "content": "hi"}]}
    first = gateway.request_hash(ModelRequest(**base))
    monkeypatch.setenv("OPENAI_API_KEY", DUMMY_KEY)
    again = gateway.request_hash(ModelRequest(**base, api_base="http://127.0.0.1:1/v1",
                                              timeout_s=5))
    assert first == again
    canonical = json.dumps({"max_tokens": None, "messages": base["messages"],
                            "model": base["model"], "temperature": 0.0},
                           sort_keys=True, separators=(",", ":"))
    assert first == hashlib.sha256(canonical.encode()).hexdigest()
    assert gateway.request_hash(ModelRequest(**base, temperature=0.5)) != first


def test_unknown_model_has_a_helpful_message():
    """An unknown provider prefix raises UnknownModelError suggesting the near name and format."""
    with pytest.raises(UnknownModelError) as caught:
        gateway.validate_model("opnai/gpt-4o-mini")
    message = str(caught.value)
    assert "'opnai'" in message and "did you mean 'openai'" in message
    assert "PROVIDER/MODEL" in message and gateway.OFFLINE_MODEL in message
    assert not gateway.known_model("local/other")
    assert not gateway.known_model("no-such-model-anywhere")
    for model in ("openai/gpt-4o-mini", "anthropic/claude-3-5-haiku-latest", "ollama/llama3",
                  "gpt-4o", gateway.OFFLINE_MODEL):
        assert gateway.known_model(model), model


def test_unknown_model_is_refused_before_any_ledger_row(ledger, sleeps):
    """complete() validates the model before reserving."""
    with pytest.raises(UnknownModelError):
        make_gateway(ledger, sleeps).complete(
            CTX, ModelRequest(model="nosuch/x", messages=[{"role": "user", "content": "x"}]))
    assert ledger.rows == []


def test_error_messages_scrub_keys():
    """Key-shaped strings and the known key never appear in a classified error's message."""

    class Boom(Exception):
        status_code = 400

    exc = Boom(f"bad key sk-proj-AbC123xyz789 and {DUMMY_KEY[3:]} api_key=hunter2hunter2")
    message = str(gateway.classify(exc, secrets=(DUMMY_KEY[3:],)))
    assert "AbC123xyz789" not in message
    assert DUMMY_KEY[3:] not in message
    assert "hunter2" not in message
    assert "sk-***" in message


def test_long_provider_bodies_are_truncated():
    """A huge provider message is cut to a short line."""

    class Boom(Exception):
        status_code = 404

    error = gateway.classify(Boom("first line " + "x" * 5000 + "\nsecond line"))
    assert isinstance(error, PermanentModelError)
    assert len(str(error).splitlines()[0]) < 300
    assert "second line" not in str(error)


def test_classify_plain_exceptions():
    """Builtin timeouts and connection errors are transient; 403 is auth; 503 transient."""

    class Status(Exception):
        def __init__(self, code: int) -> None:
            super().__init__(f"status {code}")
            self.status_code = code

    assert isinstance(gateway.classify(TimeoutError("slow")), TransientModelError)
    assert isinstance(gateway.classify(ConnectionResetError("reset")), TransientModelError)
    assert isinstance(gateway.classify(Status(403)), AuthError)
    assert isinstance(gateway.classify(Status(503)), TransientModelError)
    assert isinstance(gateway.classify(Status(429)), RateLimited)
    assert isinstance(gateway.classify(Status(402)), QuotaExhausted)
    assert isinstance(gateway.classify(ValueError("odd")), PermanentModelError)


def test_retry_after_header_forms():
    """Retry-After as seconds, as an HTTP date, and retry-after-ms are all understood."""
    from datetime import UTC, datetime

    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert gateway.retry_after_seconds({"Retry-After": "7"}) == 7.0
    assert gateway.retry_after_seconds({"retry-after-ms": "1500"}) == 1.5
    assert gateway.retry_after_seconds(
        {"Retry-After": "Wed, 01 Jan 2025 12:00:30 GMT"}, now=now) == 30.0
    assert gateway.retry_after_seconds({"Retry-After": "soon"}) is None
    assert gateway.retry_after_seconds(None) is None
