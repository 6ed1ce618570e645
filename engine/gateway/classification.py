"""Classifying provider failures: litellm/openai/httpx/OS exceptions to the engine's
ModelError classes, with short messages scrubbed of anything key-shaped and no provider body.

``classify`` is the one entry point (the gateway calls it for every failed attempt);
``scrub`` and ``retry_after_seconds`` are its helpers, usable on their own.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from keepstep.engine.errors import (
    AuthError,
    ModelError,
    PermanentModelError,
    QuotaExhausted,
    RateLimited,
    TransientModelError,
)
from keepstep.engine.gateway.redaction import body_line

_MESSAGE_LIMIT = 200


_SECRET_PATTERNS = (
    re.compile(r"sk-[A-Za-z0-9_\-*.]{4,}"),                   # OpenAI, Anthropic (sk-ant-…)
    re.compile(r"AIza[0-9A-Za-z_\-]{20,}"),                   # Google
    re.compile(r"(?i)\bbearer\s+[^\s,;'\"]+"),
    re.compile(r"(?i)(api[_-]?key|x-api-key|authorization)(['\"]?\s*[:=]\s*['\"]?)[^\s,;'\"]+"),
)
_QUOTA_MARKERS = (
    "insufficient_quota",             # OpenAI 429
    "exceeded your current quota",    # OpenAI 429
    "credit balance is too low",      # Anthropic 400
    "insufficient credits",           # OpenRouter 402
)
_LITELLM_PREFIX = re.compile(r"^(litellm\.\w+:\s*)?(\w+Error:\s*)?(\w+Exception\s*-\s*)?")


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with known secrets and anything key-shaped replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    for pattern in _SECRET_PATTERNS:
        if pattern.groups >= 2:
            text = pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
        else:
            text = pattern.sub(lambda m: m.group(0)[:3] + "***", text)
    return text


def _safe_detail(exc: BaseException, secrets: Iterable[str | None]) -> str:
    body = getattr(exc, "body", None)
    detail = body.get("message") if isinstance(body, dict) else None
    if not isinstance(detail, str) or not detail:
        detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    detail = _LITELLM_PREFIX.sub("", str(detail).strip().splitlines()[0] if detail.strip() else "")
    detail = body_line(scrub(detail, secrets), _MESSAGE_LIMIT)  # first line; no body
    if len(detail) > _MESSAGE_LIMIT:
        detail = detail[: _MESSAGE_LIMIT - 1] + "…"
    return detail or type(exc).__name__


def _status_of(exc: BaseException) -> int | None:
    for candidate in (getattr(exc, "status_code", None),
                      getattr(getattr(exc, "response", None), "status_code", None)):
        if isinstance(candidate, int):
            return candidate
    return None


def _headers_of(exc: BaseException) -> Any:
    for candidate in (getattr(getattr(exc, "response", None), "headers", None),
                      getattr(exc, "litellm_response_headers", None),
                      getattr(exc, "headers", None)):
        if candidate:
            return candidate
    return None


def retry_after_seconds(headers: Any, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``retry-after-ms`` or ``Retry-After`` header (delta or HTTP date)."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in dict(headers).items()}
    try:
        if "retry-after-ms" in lowered:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000.0)
        value = lowered.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    except (TypeError, ValueError, OverflowError):
        return None


def _is_quota(exc: BaseException, status: int | None) -> bool:
    if status == 402:
        return True
    body = getattr(exc, "body", None)
    text = json.dumps(body, default=str) if body is not None else ""
    with contextlib.suppress(Exception):  # an unread streaming response has no text
        # Read for classification only; the body never reaches a message.
        text += str(getattr(getattr(exc, "response", None), "text", "") or "")
    text = f"{text} {getattr(exc, 'message', '')} {exc}".lower()
    return any(marker in text for marker in _QUOTA_MARKERS)


def classify(exc: BaseException, *, secrets: Iterable[str | None] = ()) -> ModelError:
    """Map a litellm/openai/httpx/OS exception to the engine's ModelError classes.

    timeout, connection, 5xx, 408 → TransientModelError; 429 → RateLimited (with Retry-After)
    or QuotaExhausted when the body says the quota is gone (also 402); 401/403 → AuthError;
    anything else (400, 404, …) → PermanentModelError. Messages are short and scrubbed.
    """
    if isinstance(exc, ModelError):
        return exc
    secrets = tuple(secrets)
    detail = _safe_detail(exc, secrets)
    who = _who(exc)
    status = _status_of(exc)

    if _is_timeout(exc):
        # litellm's timeout text repeats itself ("Request timed out. Error_str: …"); say it once.
        return TransientModelError(
            f"{who}timed out waiting for the provider",
            hint="keepstep retries timeouts; raise timeout_s for slow models",
        )
    if status is None and _is_unreachable(exc):
        # Nothing listens at the address (or the name does not resolve): retrying for minutes
        # would only hide it, so say so at once.
        return PermanentModelError(
            f"{who}the model's server is unreachable (nothing answers at its api_base, or "
            f"its host name does not resolve): {detail}",
            hint="start the model's server, or fix api_base / api_bases in keepstep.toml "
                 "(`keepstep validate` shows where each model is called); then resume",
        )
    if _is_connection_error(exc) and status in (None, 500):
        return TransientModelError(
            f"{who}could not connect: {detail}",
            hint="check the network or the api_base; keepstep retries connection errors",
        )
    if status in (400, 402, 429) and _is_quota(exc, status):
        return QuotaExhausted(f"{who}quota exhausted (HTTP {status}): {detail}")
    if status == 429:
        return RateLimited(
            f"{who}rate limited (HTTP 429): {detail}",
            retry_after=retry_after_seconds(_headers_of(exc)),
            hint="keepstep waits and retries; lower parallelism if this repeats",
        )
    if status in (401, 403):
        return AuthError(f"{who}authentication failed (HTTP {status}): {detail}")
    if status is not None and (status >= 500 or status == 408):
        return TransientModelError(
            f"{who}provider error (HTTP {status}): {detail}",
            hint="keepstep retries server errors; if it persists, check the provider's status",
        )
    shown = f" (HTTP {status})" if status else ""
    return PermanentModelError(
        f"{who}request refused{shown}: {detail}",
        hint="retrying will not help: fix the request, the model name or the prompt size",
    )


def _who(exc: BaseException) -> str:
    provider, model = getattr(exc, "llm_provider", None), getattr(exc, "model", None)
    if isinstance(provider, str) and provider and isinstance(model, str) and model:
        return f"{provider}/{model}: " if not model.startswith(f"{provider}/") else f"{model}: "
    return ""


def _mro_names(exc: BaseException) -> set[str]:
    return {f"{c.__module__.split('.')[0]}.{c.__name__}" for c in type(exc).__mro__}


def _is_timeout(exc: BaseException) -> bool:
    names = _mro_names(exc)
    return isinstance(exc, TimeoutError) or bool(
        names & {"openai.APITimeoutError", "httpx.TimeoutException", "litellm.Timeout"})


_UNREACHABLE_MARKERS = ("connection refused", "name or service not known",
                        "nodename nor servname", "no address associated with hostname",
                        "temporary failure in name resolution", "getaddrinfo failed",
                        "errno 111", "errno 61", "winerror 10061")


def _is_unreachable(exc: BaseException) -> bool:
    """A refused connection or an unresolvable host, anywhere in the exception's chain."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, ConnectionRefusedError) or type(node).__name__ == "gaierror":
            return True
        if _is_connection_error(node) and any(
                m in str(node).lower() for m in _UNREACHABLE_MARKERS):
            return True
        node = node.__cause__ or node.__context__
    return False


def _is_connection_error(exc: BaseException) -> bool:
    names = _mro_names(exc)
    return isinstance(exc, ConnectionError) or bool(
        names & {"openai.APIConnectionError", "httpx.TransportError",
                 "litellm.APIConnectionError"})
