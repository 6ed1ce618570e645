"""The offline default model as a provider: ``local/keepstep-offline``.

It answers the prompts every model gets: it reads the INPUT block of the rendered user
message (``prompts.read_input_block``; in a revise round also the problems each round's
feedback names, ``read_revise_problems``, under ``"revise"``, as a model reads them), runs
``offline_model.respond`` on it and answers with
the result as sorted JSON. A message without an INPUT block (a bare JSON payload, say) is
refused: there is no second payload format.

``completion(**kwargs)`` takes the keyword arguments the gateway hands ``litellm.completion``
and returns a response of the same shape (``choices[0].message.content``, ``usage``, a zero
``response_cost``); a refused payload raises ``OfflineRequestError`` carrying HTTP 400, as
litellm's BadRequestError does. The gateway calls it for provider ``local`` in place of
litellm's dispatcher — everything around the call (reserve, limits, classification, retries,
settle, parsing) is the same code — so an offline run never imports litellm (seconds of
start-up and ~85 % of the process's memory). ``register()`` also makes the model callable
through ``litellm.completion`` for code that calls litellm itself (a ``CustomLLM`` built on
the first call, so importing this module does not import litellm); both answer the same.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from keepstep.engine.gateway import keys, offline_model
from keepstep.engine.gateway.prompts import message_text, read_input_block, read_revise_problems

PROVIDER = keys.OFFLINE_PROVIDER
MODEL = f"{PROVIDER}/{offline_model.MODEL_NAME}"
# Generous limits: the heuristic model has no context window, but litellm wants figures.
MAX_TOKENS = 1_000_000

_lock = threading.Lock()
_handler: Any = None


class OfflinePayloadError(ValueError):
    """The request could not be turned into an offline-model payload."""


def build_response_content(messages: list[dict[str, Any]]) -> str:
    """The JSON text the offline provider answers for ``messages`` (a rendered prompt).

    Raises OfflinePayloadError when no user message carries an INPUT block, or
    ``offline_model.respond`` rejects the block.
    """
    payload = read_input_block(messages)
    if payload is None:
        raise OfflinePayloadError(
            "the offline model answers keepstep prompts: no user message carries an INPUT "
            "block (a line 'INPUT' then a ```json fence)")
    revise = read_revise_problems(messages)
    if revise:
        payload["revise"] = revise
    try:
        result = offline_model.respond(payload)
    except ValueError as exc:
        raise OfflinePayloadError(str(exc)) from None
    return json.dumps(result, sort_keys=True, ensure_ascii=False)


class OfflineRequestError(ValueError):
    """A request the offline model refuses: HTTP 400 (the gateway classifies it permanent)."""

    status_code = 400
    llm_provider = PROVIDER
    model = MODEL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OfflineResponse:
    """The response of ``completion``: what the gateway reads of a litellm ModelResponse."""

    def __init__(self, content: str, tokens_in: int, tokens_out: int) -> None:
        self.model = MODEL
        self.choices = [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}]
        self.usage = {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                      "total_tokens": tokens_in + tokens_out}
        self._hidden_params = {"response_cost": 0.0}


def answer(messages: list[dict[str, Any]]) -> tuple[str, int, int]:
    """(content, tokens in, tokens out) for a rendered prompt; OfflinePayloadError."""
    content = build_response_content(messages)
    prompt_text = "\n".join(message_text(m.get("content")) for m in messages)
    return content, offline_model.count_tokens(prompt_text), offline_model.count_tokens(content)


def completion(*, model: str, messages: list[dict[str, Any]], **_options: Any) -> OfflineResponse:
    """The offline model's answer to a ``litellm.completion``-style call (see the module)."""
    if model != MODEL:
        raise OfflineRequestError(f"the only local model is {MODEL}, not {model!r}")
    try:
        return OfflineResponse(*answer(messages))
    except OfflinePayloadError as exc:
        raise OfflineRequestError(str(exc)) from None


def _make_handler(litellm: Any) -> Any:
    from litellm.llms.custom_llm import CustomLLM, CustomLLMError

    class OfflineLLM(CustomLLM):
        """litellm provider ``local``: deterministic, no network, no key."""

        def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Any:
            try:
                content, tokens_in, tokens_out = answer(messages)
            except OfflinePayloadError as exc:
                # 400 so litellm raises BadRequestError: a bad payload will not get better
                # by retrying.
                raise CustomLLMError(status_code=400, message=str(exc)) from None
            return litellm.ModelResponse(
                model=MODEL,
                choices=[{
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }],
                usage=litellm.Usage(
                    prompt_tokens=tokens_in,
                    completion_tokens=tokens_out,
                    total_tokens=tokens_in + tokens_out,
                ),
            )

        async def acompletion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Any:
            return self.completion(model, messages, *args, **kwargs)

    return OfflineLLM()


def register(litellm: Any) -> None:
    """Register provider ``local`` and the zero price of ``local/keepstep-offline``; idempotent.

    ``litellm`` is the imported module (passed in so this module never imports it itself).
    """
    global _handler
    with _lock:
        if _handler is not None and any(
            item.get("custom_handler") is _handler for item in litellm.custom_provider_map
        ):
            return
        _handler = _make_handler(litellm)
        # Keep other registrations; replace only a stale "local" entry.
        litellm.custom_provider_map = [
            item for item in litellm.custom_provider_map if item.get("provider") != PROVIDER
        ] + [{"provider": PROVIDER, "custom_handler": _handler}]
        litellm.register_model({
            MODEL: {
                "litellm_provider": PROVIDER,
                "mode": "chat",
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                # Named explicitly: litellm warns when cache prices are missing.
                "cache_creation_input_token_cost": 0.0,
                "cache_read_input_token_cost": 0.0,
                "max_tokens": MAX_TOKENS,
                "max_input_tokens": MAX_TOKENS,
                "max_output_tokens": MAX_TOKENS,
            }
        })
