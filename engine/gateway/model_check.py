"""Checks of a project's models that need no call: is each model name one litellm knows
(with "did you mean" when it is close to one), and is a key available for its provider?

Used by ``keepstep validate``. litellm is loaded only when a project names a model other
than the offline one.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel

from keepstep.engine.errors import UnknownModelError
from keepstep.engine.gateway import keys, offline_provider

Level = Literal["error", "warning", "ok"]
# Local servers run whatever model was pulled; litellm's list cannot know their names.
_ANY_NAME_PROVIDERS = frozenset({"ollama", "ollama_chat", "lm_studio", "llamafile", "hosted_vllm",
                                 "openai_like", "custom_openai"})


class ModelFinding(BaseModel):
    level: Level
    model: str
    units: list[str]
    message: str


def _names_for(litellm: object, provider: str) -> list[str]:
    cost = getattr(litellm, "model_cost", {})
    out = []
    for name, info in cost.items():
        if isinstance(info, dict) and info.get("litellm_provider") == provider:
            out.append(name if name.startswith(f"{provider}/") else f"{provider}/{name}")
    return sorted(set(out))


def check_model(model: str, *, api_base: str | None = None,
                env: Mapping[str, str] = os.environ) -> list[tuple[Level, str]]:
    """``(level, message)`` findings for one model name; empty when all is well."""
    from keepstep.engine.gateway.client import _litellm, provider_of

    if model == offline_provider.MODEL:
        return []
    try:
        provider = provider_of(model)
    except UnknownModelError as exc:
        return [("error", str(exc).splitlines()[0])]
    findings: list[tuple[Level, str]] = []
    litellm = _litellm()
    if provider not in _ANY_NAME_PROVIDERS:
        name = model.split("/", 1)[1] if "/" in model else model
        cost = litellm.model_cost
        if name not in cost and model not in cost:
            near = difflib.get_close_matches(model, _names_for(litellm, provider), n=1,
                                             cutoff=0.75)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            findings.append(("warning", f"{model}: litellm's model list does not know this "
                             f"name{hint}; its price and window are unknown, so keepstep "
                             "uses context_tokens and counts its cost as 0"))
    if keys.key_required(provider, api_base=api_base) and keys.key_source(provider, env=env) \
            is None:
        findings.append(("error", f"{model}: no API key for provider '{provider}': set "
                         f"{keys.env_var_name(provider)} or run `keepstep keys set {provider}`"))
    address, origin = keys.provider_address(provider, configured=api_base, env=env)
    if keys.unexpected_address(provider, address) and keys.key_source(provider, env=env):
        findings.append(("warning", f"{model}: the {provider} key will be sent to {address} "
                         f"({origin}), not {keys.DEFAULT_ADDRESSES[provider]}"))
    return findings


def check_project_models(config: object, units: list[tuple[str, str]],
                         env: Mapping[str, str] = os.environ) -> list[ModelFinding]:
    """Findings for every model the plan's units would call (``(unit id, kind)`` pairs),
    errors first; a model with no finding gets an ``ok`` line."""
    out: list[ModelFinding] = []
    for model, used_by in config.models_in_use(units).items():  # type: ignore[attr-defined]
        found = check_model(model, api_base=config.api_base_for(model),  # type: ignore
                            env=env)
        if not found:
            out.append(ModelFinding(level="ok", model=model, units=used_by,
                                    message=f"{model}: known, key available"
                                    if model != offline_provider.MODEL else
                                    f"{model}: offline heuristic model, no key needed"))
        out += [ModelFinding(level=level, model=model, units=used_by, message=message)
                for level, message in found]
    order = {"error": 0, "warning": 1, "ok": 2}
    return sorted(out, key=lambda f: order[f.level])


__all__ = ["ModelFinding", "check_model", "check_project_models"]
