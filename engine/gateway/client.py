"""The model gateway: every model call in keepstep goes through ``ModelGateway.complete``.

This module family (gateway, offline_provider) is the only code that imports litellm, and it
does so lazily: importing ``keepstep.engine.gateway.client`` loads neither litellm nor textual.

Callers may rely on:
- one ledger row per provider attempt: ``reserve`` before the call (a BudgetExhausted there
  means the provider is never called), ``settle`` after it with the outcome class;
- retries only for transient and rate-limited errors, bounded by ``RetryPolicy.max_attempts``,
  with backoff slept through the injected ``sleep``; then the last classified error is raised;
- every raised ModelError having a short message with secrets scrubbed and no provider body;
- the API key never being stored, logged or put in a ledger row or request hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from keepstep.engine.errors import (
    InvalidOutput,
    ModelError,
    RateLimited,
    RunCancelled,
    TransientModelError,
    UnknownModelError,
)
from keepstep.engine.gateway import keys, offline_provider
from keepstep.engine.gateway.classification import (  # noqa: F401 - part of this module's API
    classify,
    retry_after_seconds,
    scrub,
)
from keepstep.engine.gateway.outage import OutageClock, ProviderOutage, report_wait, wait_text

OFFLINE_MODEL = offline_provider.MODEL
OUTCOME_OK = "ok"
# Sent to OpenAI-compatible servers on this machine that need no key: the OpenAI SDK refuses
# to send a request without one (litellm then reports a misleading HTTP 500).
_LOCAL_PLACEHOLDER_KEY = "keepstep-local-no-key"


class CallContext(BaseModel):
    """Where a call belongs in a run; the ledger keys its rows by this."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    branch: str = "main"
    unit: str
    attempt: str
    round: int = 1


class ModelRequest(BaseModel):
    """One chat completion request. ``expect_json`` makes content with no JSON object in it
    InvalidOutput (read as leniently as ``parse_json_content``). ``response_format`` is the
    structured-output request (see ``profile.ModelProfile.response_format``); ``options``
    are provider options such as Ollama's ``num_ctx``."""

    model_config = ConfigDict(frozen=True)

    model: str
    messages: list[dict[str, str]]
    temperature: float = 0.0
    max_tokens: int | None = None
    api_base: str | None = None
    timeout_s: float = 120.0
    expect_json: bool = False
    response_format: dict[str, Any] | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    # keepstep.toml's price per (input, output) token for the model: a call's cost is its
    # tokens at this price instead of litellm's (which has none for the model, or another).
    # Not part of the request hash: it does not change the answer.
    price_per_token: tuple[float, float] | None = None


class ModelResult(BaseModel):
    """A successful call. ``retries`` counts failed attempts before this one; ``call_id`` is
    the ledger row of the attempt that answered (to attach the answer's verdict to)."""

    content: str
    model: str
    tokens_in: int
    tokens_out: int
    cost: float
    latency_ms: int
    request_hash: str
    outcome: str = OUTCOME_OK
    retries: int = 0
    call_id: str = ""
    finish_reason: str | None = None


class CallLedger(Protocol):
    def reserve(self, ctx: CallContext, *, model: str, request_hash: str, est_tokens: int,
                est_cost: float = 0.0) -> str:
        """Record an intended call and return its id, reserving its estimated tokens and cost
        against the budget; raise BudgetExhausted to refuse it."""
        ...

    def settle(self, call_id: str, *, tokens_in: int, tokens_out: int, cost: float,
               latency_ms: int, outcome: str, error_class: str | None = None,
               safe_message: str | None = None) -> None:
        """Record what the reserved call actually used and how it ended."""
        ...


class RetryPolicy(BaseModel):
    """Backoff for transient and rate-limited errors: ``base * 2**n`` plus up to ``jitter``."""

    model_config = ConfigDict(frozen=True)

    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    jitter: float = 0.25

    def delay(self, retry_number: int, rng: random.Random,
              retry_after: float | None = None) -> float:
        """Seconds to wait before retry ``retry_number`` (1-based); never above max_delay_s.

        A provider's Retry-After is honoured as a floor (capped at max_delay_s).
        """
        backoff = self.base_delay_s * (2 ** (retry_number - 1))
        backoff *= 1.0 + self.jitter * rng.random()
        if retry_after is not None:
            backoff = max(backoff, retry_after)
        return max(0.0, min(backoff, self.max_delay_s))


# --- litellm, loaded on first use ------------------------------------------------------

_litellm_lock = threading.Lock()


def _litellm() -> ModuleType:
    """Import and configure litellm once: local price map, quiet, offline provider registered."""
    with _litellm_lock:
        # Without this litellm fetches its price map from GitHub at import time.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.suppress_debug_info = True
        offline_provider.register(litellm)
        return litellm


def warm_up(models: Iterable[str] = ()) -> None:
    """Do, ahead of the first call, what a process's first model call would otherwise pay
    for while a unit waits: import litellm and the completion path it loads lazily, and the
    tokenizer each model's token counting uses. Nothing for the offline model, which is
    answered without litellm. Safe to call from a background thread; an error is left for
    the first real call to report."""
    models = [m for m in models if m.split("/", 1)[0] != offline_provider.PROVIDER]
    if not models:
        return  # the offline model needs neither litellm nor a tokenizer
    litellm = _litellm()
    for model in models:
        with contextlib.suppress(Exception):
            litellm.token_counter(model=model, text="warm up")  # loads the tokenizer
            # A mock answer goes through litellm's request and response building (the
            # modules it imports on first use) without any network or key.
            litellm.completion(model=model, messages=[{"role": "user", "content": "warm up"}],
                               mock_response="ok", max_retries=0)


# --- models ----------------------------------------------------------------------------

def provider_of(model: str) -> str:
    """The litellm provider that serves ``model``; raises UnknownModelError."""
    validate_model(model)
    if model.split("/", 1)[0] == offline_provider.PROVIDER:
        return offline_provider.PROVIDER
    return str(_litellm().get_llm_provider(model)[1])


def known_model(model: str) -> bool:
    """True when litellm can route ``model`` (a known provider prefix, or a model it knows)."""
    try:
        validate_model(model)
    except UnknownModelError:
        return False
    return True


def validate_model(model: str) -> None:
    """Raise UnknownModelError, with a suggestion, unless litellm can route ``model``."""
    prefix, _, name = model.partition("/")
    if prefix == offline_provider.PROVIDER:
        if model == OFFLINE_MODEL:
            return
        raise UnknownModelError(
            f"unknown model {model!r}: the only local model is {OFFLINE_MODEL}",
            hint=f"use {OFFLINE_MODEL}, or ollama/MODEL for a model served by Ollama",
        )
    litellm = _litellm()
    providers = sorted(str(getattr(p, "value", p)) for p in litellm.provider_list)
    if name and prefix in providers:
        return
    try:
        litellm.get_llm_provider(model)
        return
    except Exception:  # noqa: BLE001, S110 - litellm raises assorted types for "cannot route"
        pass
    if name:
        near = _close(prefix, providers)
        message = f"unknown model {model!r}: {prefix!r} is not a provider litellm knows" + (
            f" (did you mean {near!r}?)" if near else "")
    else:
        message = f"unknown model {model!r}: litellm cannot tell which provider serves it"
    raise UnknownModelError(message, hint=_MODEL_HINT)


_MODEL_HINT = (
    "write models as PROVIDER/MODEL, e.g. openai/gpt-4o-mini, anthropic/claude-3-5-haiku-latest, "
    f"ollama/llama3, or {OFFLINE_MODEL} (offline, no key)"
)


def _close(word: str, options: list[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, options, n=1, cutoff=0.75)
    return found[0] if found else None


def request_hash(request: ModelRequest) -> str:
    """sha256 of the canonical JSON of what determines the answer; no key, no endpoint.
    ``response_format`` and ``options`` join it only when set."""
    determining: dict[str, Any] = {
        "model": request.model,
        "messages": request.messages,
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
    }
    if request.response_format is not None:
        determining["response_format"] = request.response_format
    if request.options:
        determining["options"] = request.options
    canonical = json.dumps(
        determining,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def estimate_tokens(request: ModelRequest) -> int:
    """A cheap upper-ish estimate for budget reservation: prompt chars / 4 plus max_tokens."""
    prompt_chars = sum(len(m.get("content") or "") for m in request.messages)
    return -(-prompt_chars // 4) + (request.max_tokens or 0)


# --- the gateway -----------------------------------------------------------------------

class ModelGateway:
    """Calls models through litellm with ledger rows, classification and bounded retries.

    Time, sleep, randomness, the completion function and key lookup are injected so tests are
    deterministic. One gateway may be shared by threads if its ledger is thread-safe.
    """

    def __init__(
        self,
        *,
        ledger: CallLedger,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        completion_fn: Callable[..., Any] | None = None,
        api_key_lookup: Callable[[str], str | None] = keys.get_api_key,
        cancel_event: threading.Event | None = None,
        limits: Any | None = None,
        outage_limit_s: float | None = None,
    ) -> None:
        self._ledger = ledger
        # With a limit, transient provider trouble waits (up to the limit) instead of using
        # up the unit's tries (gateway.outage); None: the bounded retries below only.
        self._outage_limit_s = outage_limit_s
        self._outages = OutageClock()
        # Provider-wide concurrency, rate limits and 429 back-off (gateway.limits); None: none.
        self._limits = limits
        self._policy = policy or RetryPolicy()
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._completion_fn = completion_fn
        self._api_key_lookup = api_key_lookup
        self._cancel = cancel_event

    def complete(self, ctx: CallContext, request: ModelRequest, *,
                 est_tokens: int | None = None, est_cost: float = 0.0) -> ModelResult:
        """Call the model, retrying transient and rate-limited errors; see the module doc.

        ``est_tokens`` / ``est_cost`` are reserved before each attempt (default: a cheap
        estimate, no cost). Each retry is also charged to the ``retries`` budget when the
        ledger keeps one (``reserve_retry``). Raises UnknownModelError or MissingKeyError
        before any ledger row, BudgetExhausted from the ledger, RunCancelled between attempts,
        or the last classified ModelError.
        """
        provider = provider_of(request.model)
        # Keyless providers never touch the keyring (on some desktops a lookup prompts).
        api_key = None if provider in keys.KEYLESS_PROVIDERS else self._api_key_lookup(provider)
        if api_key is None and keys.key_required(provider, api_base=request.api_base):
            raise keys.missing_key_error(provider)
        rhash = request_hash(request)
        est_tokens = estimate_tokens(request) if est_tokens is None else est_tokens
        kwargs = self._call_kwargs(request, provider, api_key)
        attempts = max(1, self._policy.max_attempts)
        reserve_retry = getattr(self._ledger, "reserve_retry", None)

        limiter = self._limits.limiter(provider) if self._limits is not None else None
        attempt, waiting = 0, False
        while attempt < attempts:
            # A wait for the provider is not one of the unit's tries (nor a budgeted retry).
            attempt += 0 if waiting else 1
            self._check_cancelled()
            if attempt > 1 and not waiting and reserve_retry is not None:
                reserve_retry(ctx)
            reserve_kwargs: dict[str, Any] = {"est_tokens": est_tokens}
            if est_cost:
                reserve_kwargs["est_cost"] = est_cost
            slot = limiter.slot(est_tokens, cancel=self._cancel) if limiter is not None \
                else contextlib.nullcontext()
            with slot:
                call_id = self._ledger.reserve(ctx, model=request.model, request_hash=rhash,
                                               **reserve_kwargs)
                started = self._clock()
                try:
                    response = self._completion(provider)(**kwargs)
                    error = None
                # RunCancelled/LeaseLost (BaseException) pass through and leave the row reserved
                # but unsettled: whether the provider charged for it is unknown, and the ledger
                # says so.
                except Exception as exc:  # noqa: BLE001 - every provider failure is classified
                    error = classify(exc, secrets=(api_key,))
                    retry_after = error.retry_after if isinstance(error, RateLimited) else None
                    waiting = self._outage_limit_s is not None and \
                        isinstance(error, TransientModelError | RateLimited)
                    delay = self._wait_delay(provider, retry_after) if waiting else \
                        self._policy.delay(attempt, self._rng, retry_after)
                    if limiter is not None and (waiting or isinstance(error, RateLimited)):
                        # Before the slot is given back: the provider is down for everyone.
                        limiter.back_off(delay)
            if error is not None:
                self._ledger.settle(
                    call_id, tokens_in=0, tokens_out=0, cost=0.0,
                    latency_ms=self._elapsed_ms(started), outcome=error.error_class,
                    error_class=type(error).__name__, safe_message=_message_of(error),
                )
                if waiting:
                    down_s = self._outages.failed(provider, self._clock())
                    limit = float(self._outage_limit_s or 0.0)
                    if down_s + delay > limit:
                        raise ProviderOutage(provider, max(down_s, limit),
                                             _message_of(error)) from None
                    report_wait(wait_text(provider, error, delay))
                    self._pause(delay)
                    continue
                retryable = isinstance(error, TransientModelError | RateLimited)
                if not retryable or attempt == attempts:
                    raise error from None
                self._pause(delay)
                continue
            self._outages.answered(provider)
            return self._settle_success(call_id, request, rhash, response, started,
                                        retries=attempt - 1, secrets=(api_key,))
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def _wait_delay(self, provider: str, retry_after: float | None) -> float:
        """How long to back a failing provider off: Retry-After when it says (up to the
        outage limit), else the policy's back-off grown with the failures so far."""
        if retry_after is not None:
            return max(0.0, min(retry_after, float(self._outage_limit_s or 0.0)))
        failures = self._outages.failures(provider)
        return self._policy.delay(min(failures, 16), self._rng)

    # -- helpers --------------------------------------------------------------------------

    def _completion(self, provider: str) -> Callable[..., Any]:
        """The provider's transport: litellm's dispatcher, or — for the offline model — its
        own ``completion`` with the same arguments and response shape (no litellm import)."""
        if self._completion_fn is not None:
            # An injected fn (tests) is called with litellm imported and the offline
            # provider registered, as it always was: it may call litellm itself.
            _litellm()
            return self._completion_fn
        if provider == offline_provider.PROVIDER:
            return offline_provider.completion
        return _litellm().completion

    def _call_kwargs(self, request: ModelRequest, provider: str,
                     api_key: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": [dict(m) for m in request.messages],
            "temperature": request.temperature,
            "timeout": request.timeout_s,
            # The gateway owns retries; litellm and the OpenAI SDK must not add their own.
            "max_retries": 0,
            "num_retries": 0,
        }
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        if request.response_format is not None:
            kwargs["response_format"] = request.response_format
        kwargs.update(request.options)
        if request.api_base:
            kwargs["api_base"] = request.api_base
        if api_key is not None:
            kwargs["api_key"] = api_key
        elif provider not in keys.KEYLESS_PROVIDERS and keys.is_local_api_base(request.api_base):
            kwargs["api_key"] = _LOCAL_PLACEHOLDER_KEY
        return kwargs

    def _settle_success(self, call_id: str, request: ModelRequest, rhash: str, response: Any,
                        started: float, *, retries: int, secrets: tuple[str | None, ...]
                        ) -> ModelResult:
        latency_ms = self._elapsed_ms(started)
        try:
            content = _content_of(response)
            tokens_in, tokens_out = _usage_of(response)
        except Exception as exc:  # noqa: BLE001 - a malformed response is an invalid output
            error: ModelError = InvalidOutput(
                f"{request.model}: the response had no readable content "
                f"({scrub(type(exc).__name__, secrets)})")
            self._ledger.settle(call_id, tokens_in=0, tokens_out=0, cost=0.0,
                                latency_ms=latency_ms, outcome=error.error_class,
                                error_class=type(error).__name__, safe_message=_message_of(error))
            raise error from None
        cost = (tokens_in * request.price_per_token[0] + tokens_out * request.price_per_token[1]
                if request.price_per_token else _cost_of(response))
        if request.expect_json and not _is_json(content):
            error = InvalidOutput(
                f"{request.model}: expected JSON, got {len(content)} characters holding no "
                "JSON object",
                hint="the revise loop may ask again; a repeat means the prompt needs work",
            )
            self._ledger.settle(call_id, tokens_in=tokens_in, tokens_out=tokens_out, cost=cost,
                                latency_ms=latency_ms, outcome=error.error_class,
                                error_class=type(error).__name__, safe_message=_message_of(error))
            raise error
        self._ledger.settle(call_id, tokens_in=tokens_in, tokens_out=tokens_out, cost=cost,
                            latency_ms=latency_ms, outcome=OUTCOME_OK)
        return ModelResult(
            content=content, model=request.model, tokens_in=tokens_in, tokens_out=tokens_out,
            cost=cost, latency_ms=latency_ms, request_hash=rhash, retries=retries,
            call_id=call_id, finish_reason=_finish_reason_of(response),
        )

    def _elapsed_ms(self, started: float) -> int:
        return max(0, round((self._clock() - started) * 1000))

    def _check_cancelled(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise RunCancelled("cancelled while calling a model")

    def _pause(self, seconds: float) -> None:
        self._check_cancelled()
        if self._cancel is not None and self._sleep is time.sleep:
            # The real sleep wakes early on cancellation.
            self._cancel.wait(seconds)
        else:
            self._sleep(seconds)
        self._check_cancelled()


def _message_of(error: ModelError) -> str:
    # The message without the hint: the hint follows from error_class, the row stays short.
    return str(error.args[0]) if error.args else type(error).__name__


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _content_of(response: Any) -> str:
    message = _field(_field(response, "choices")[0], "message")
    content = _field(message, "content")
    return "" if content is None else str(content)


def _finish_reason_of(response: Any) -> str | None:
    try:
        reason = _field(_field(response, "choices")[0], "finish_reason")
    except Exception:  # noqa: BLE001 - a provider without choices metadata
        return None
    return str(reason) if reason else None


def _usage_of(response: Any) -> tuple[int, int]:
    usage = _field(response, "usage")
    if usage is None:
        return 0, 0
    return int(_field(usage, "prompt_tokens") or 0), int(_field(usage, "completion_tokens") or 0)


def _cost_of(response: Any) -> float:
    hidden = getattr(response, "_hidden_params", None) or {}
    if isinstance(hidden.get("response_cost"), int | float):
        return float(hidden["response_cost"])
    if "response_cost" in hidden:
        return 0.0  # litellm priced it already and found no price: asking again costs ~5 ms
    try:
        return float(_litellm().completion_cost(completion_response=response) or 0.0)
    except Exception:  # noqa: BLE001 - unpriced models (local servers, new names) cost 0.0
        return 0.0


def parse_json_content(content: str) -> Any:
    """The JSON object in a model's answer, read leniently (a fence, prose around it, small
    syntax slips: see ``answers.parse_json_answer``).

    Raises ValueError when there is none. ``expect_json`` requests are checked with this,
    so a caller parsing a successful result with it will not fail.
    """
    from keepstep.engine.gateway.answers import parse_json_answer

    value, problems = parse_json_answer(content)
    if problems:
        raise ValueError(problems[0].message)
    return value


def _is_json(content: str) -> bool:
    try:
        parse_json_content(content)
    except ValueError:
        return False
    return True
