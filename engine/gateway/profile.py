"""What keepstep knows about a model before calling it: window, output cap, price, how it
takes an output schema. All of it comes from litellm's model information (its local price
map), with keepstep.toml's ``context_tokens`` as the fallback for a model litellm does not
know — nothing here calls a model.

Callers may rely on:
- ``ModelProfile.count`` counting a request's tokens with litellm's counter for the model
  (the offline model counts like its provider reports: ``ceil(chars / 4)``);
- ``input_tokens`` being what one request's messages may use; ``max_tokens_for(expected)``
  what a request whose answer is expected to take ``expected`` tokens sends as ``max_tokens``
  (and reserves): sized from the estimate, within ``answer_limit`` (the model's own output
  limit); ``output_tokens`` (the configured ``max_tokens``) for a request with no estimate;
- ``estimate_cost`` being the price × tokens: keepstep.toml's ``[model_settings]`` price when
  it gives one, else litellm's (0.0 for an unpriced model);
- ``response_format`` / ``options`` being what the gateway sends: a json_schema
  ``response_format`` (strict where litellm says the model supports response schemas), the
  same for Ollama (litellm sends it as Ollama's ``format``) plus ``num_ctx``; ``None`` for a
  provider without structured output, whose prompt then carries the schema as text.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from keepstep.engine.errors import PermanentModelError
from keepstep.engine.gateway import offline_provider
from keepstep.engine.gateway.answers import strict_schema

DEFAULT_CONTEXT_TOKENS = 32_768  # a model litellm does not know, without context_tokens
OLLAMA_CONTEXT_TOKENS = 8_192  # sent as num_ctx: Ollama's own default window is smaller
DEFAULT_MAX_TOKENS = 4_096
# A sized answer gets half as much again as its estimate, and never less than this.
_ANSWER_SLACK, _MIN_ANSWER_TOKENS = 1.5, 512
OLLAMA_PROVIDERS = ("ollama", "ollama_chat")

Structured = Literal["json_schema", "ollama", "prompt"]


class RequestTooLarge(PermanentModelError):
    """One request cannot fit the model's window; refused before any call or reservation."""


class ModelProfile(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    provider: str
    input_tokens: int
    output_tokens: int
    window_source: str  # "litellm", "context_tokens" or "default"
    structured: Structured
    strict: bool = False
    num_ctx: int | None = None
    input_cost_per_token: float = 0.0
    output_cost_per_token: float = 0.0
    price_source: Literal["litellm", "keepstep.toml"] = "litellm"
    # The most one answer may take: the model's own output limit (keepstep.toml's
    # max_output_tokens, else litellm's), else the configured max_tokens. 0: output_tokens.
    output_limit: int = 0

    @property
    def answer_limit(self) -> int:
        """The most tokens one answer may be given (see ``output_limit``)."""
        return max(self.output_limit, self.output_tokens)

    def max_tokens_for(self, expected: int | None) -> int:
        """``max_tokens`` for a request whose answer is expected to take ``expected`` tokens:
        that with room to spare, within the model's output limit; without an estimate, the
        configured ``max_tokens``."""
        if not expected:
            return self.output_tokens
        return min(self.answer_limit, max(_MIN_ANSWER_TOKENS,
                                          math.ceil(expected * _ANSWER_SLACK)))

    @property
    def offline(self) -> bool:
        return self.provider == offline_provider.PROVIDER

    @property
    def schema_in_prompt(self) -> bool:
        """Whether the answer's JSON Schema must be written into the prompt text."""
        return self.structured != "json_schema"

    def count(self, messages: list[dict[str, Any]]) -> int:
        # A step's request is counted to size its chunks and again to reserve its budget:
        # the same text, counted once.
        return _count_cached(self.model, self.offline, tuple(
            (str(m.get("role") or ""), str(m.get("content") or "")) for m in messages))

    def count_text(self, text: str) -> int:
        return self.count([{"role": "user", "content": text}])

    def estimate_cost(self, tokens_in: int, tokens_out: int) -> float:
        return tokens_in * self.input_cost_per_token + tokens_out * self.output_cost_per_token

    def response_format(self, name: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        if self.structured == "prompt":
            return None
        body: dict[str, Any] = {"name": name, "schema": schema}
        if self.strict:
            body = {"name": name, "schema": strict_schema(schema), "strict": True}
        return {"type": "json_schema", "json_schema": body}

    def options(self) -> dict[str, Any]:
        return {"num_ctx": self.num_ctx} if self.num_ctx else {}

    def window_text(self) -> str:
        source = {"litellm": "litellm's model information",
                  "context_tokens": "context_tokens in keepstep.toml",
                  "default": f"keepstep's default for a model litellm does not know "
                  f"({DEFAULT_CONTEXT_TOKENS:,})"}[self.window_source]
        return f"{self.model} takes at most {self.input_tokens:,} input tokens ({source})"

    def too_large(self, what: str, tokens: int) -> RequestTooLarge:
        return RequestTooLarge(
            f"{what} needs ~{tokens:,} tokens but {self.window_text()}; refused before any call",
            hint="use a model with a larger window (or set context_tokens in keepstep.toml if "
            "the model's real window is larger), or split the input into smaller units")


def _litellm() -> Any:
    from keepstep.engine.gateway.client import _litellm as load

    return load()


@functools.lru_cache(maxsize=32)  # a chunk of a long source may be large: a few kept
def _count_cached(model: str, offline: bool, messages: tuple[tuple[str, str], ...]) -> int:
    if offline:
        from keepstep.engine.gateway.offline_model import count_tokens

        return count_tokens("\n".join(content for _role, content in messages))
    return _count(model, [{"role": role, "content": content} for role, content in messages])


def _count(model: str, messages: list[dict[str, Any]]) -> int:
    try:
        return int(_litellm().token_counter(model=model, messages=messages))
    except Exception:  # noqa: BLE001 - an unknown tokenizer: a cautious estimate instead
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        return math.ceil(chars / 3)


@functools.lru_cache(maxsize=64)
def model_profile(model: str, *, max_tokens: int | None = None,
                  context_tokens: int | None = None,
                  price: tuple[float, float] | None = None,
                  max_output_tokens: int | None = None) -> ModelProfile:
    """The profile of ``model`` under a project's ``max_tokens`` / ``context_tokens``;
    ``price`` (per input and output token) and ``max_output_tokens`` are keepstep.toml's
    ``[model_settings]`` for the model, winning over litellm's information."""
    from keepstep.engine.gateway.client import provider_of

    provider = provider_of(model)
    output = int(max_tokens or DEFAULT_MAX_TOKENS)
    if provider == offline_provider.PROVIDER:
        # Known without asking litellm (its import is slow): no window to speak of, no price.
        return ModelProfile(model=model, provider=provider,
                            input_tokens=offline_provider.MAX_TOKENS, output_tokens=output,
                            window_source="litellm", structured="prompt")
    litellm = _litellm()
    info: dict[str, Any] = {}
    try:
        info = dict(litellm.get_model_info(model))
    except Exception:  # noqa: BLE001, S110 - litellm does not know every model
        pass
    known_in = info.get("max_input_tokens") or info.get("max_tokens")
    known_out = max_output_tokens or info.get("max_output_tokens")
    if known_out:
        output = min(output, int(known_out))
    limit = int(known_out) if known_out else output
    num_ctx = None
    if provider in OLLAMA_PROVIDERS:
        # Ollama's window holds prompt and answer together; keepstep sets it explicitly so a
        # long prompt is never silently truncated at Ollama's default.
        num_ctx = int(context_tokens or known_in or OLLAMA_CONTEXT_TOKENS)
        window, source = num_ctx - output, ("context_tokens" if context_tokens else
                                            "litellm" if known_in else "default")
        limit = output  # prompt and answer share num_ctx: the answer keeps its reserved part
        structured: Structured = "ollama"
    else:
        if known_in:
            window, source = int(known_in), "litellm"
        elif context_tokens:
            window, source = int(context_tokens) - output, "context_tokens"
        else:
            window, source = DEFAULT_CONTEXT_TOKENS - output, "default"
        structured = "json_schema" if _supports_schema(litellm, model) else "prompt"
    return ModelProfile(
        model=model, provider=provider, input_tokens=max(1, window), output_tokens=output,
        window_source=source, structured=structured, strict=structured == "json_schema",
        num_ctx=num_ctx, output_limit=limit,
        input_cost_per_token=price[0] if price else float(info.get("input_cost_per_token") or 0.0),
        output_cost_per_token=price[1] if price else float(
            info.get("output_cost_per_token") or 0.0),
        price_source="keepstep.toml" if price else "litellm")


def _supports_schema(litellm: Any, model: str) -> bool:
    if model.startswith(f"{offline_provider.PROVIDER}/"):
        return False  # the offline model reads the schema from nowhere: same prompt as text
    try:
        return bool(litellm.supports_response_schema(model))
    except Exception:  # noqa: BLE001
        return False


__all__ = ["DEFAULT_CONTEXT_TOKENS", "DEFAULT_MAX_TOKENS", "ModelProfile", "RequestTooLarge",
           "model_profile"]
