"""Checks of a project's models that need no call: is each model name one litellm knows
(with "did you mean" when it is close to one), and is a key available for its provider?

Used by ``keepstep validate``. litellm is loaded only when a project names a model other
than the offline one.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from keepstep.engine.errors import UnknownModelError
from keepstep.engine.gateway import keys, offline_provider

if TYPE_CHECKING:
    from keepstep.engine.files.project import ProjectConfig, ProjectFiles

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
        if _unpriced_under_budget(config, model):
            out.append(ModelFinding(
                level="warning", model=model, units=used_by,
                message=f"{model}: no known price, and keepstep.toml sets a cost budget: its "
                "calls will be blocked (the budget could not be kept); give its price in "
                f'keepstep.toml ([model_settings."{model}"] input_per_mtok and '
                "output_per_mtok), use a priced model, call it through your own server "
                "(api_base), or remove [budget] cost"))
    order = {"error": 0, "warning": 1, "ok": 2}
    return sorted(out, key=lambda f: order[f.level])


def _unpriced_under_budget(config: object, model: str) -> bool:
    """Whether the call ledger will refuse ``model``'s calls (see call_ledger.UnpricedModel)."""
    from keepstep.engine.gateway.call_ledger import FREE_PROVIDERS
    from keepstep.engine.gateway.profile import model_profile

    budget = getattr(config, "budget", None)
    if not getattr(budget, "cost", None) or model.split("/", 1)[0] in FREE_PROVIDERS:
        return False
    if config.api_base_for(model):  # type: ignore[attr-defined]
        return False
    settings_for = getattr(config, "settings_for", None)
    if settings_for is not None and settings_for(model).price_per_token() is not None:
        return False  # keepstep.toml prices it
    try:
        profile = model_profile(model)
    except Exception:  # noqa: BLE001 - an unknown name has its own finding already
        return False
    return profile.provider not in FREE_PROVIDERS and profile.input_cost_per_token <= 0 \
        and profile.output_cost_per_token <= 0


# -- keys: where each provider's key comes from and where its calls go ----------------------
class KeyStatus(BaseModel):
    """A provider as ``keepstep keys status`` shows it: never the key itself."""

    provider: str
    key: str  # "environment OPENAI_API_KEY" | "OS keyring" | "not needed" | "missing"
    address: str
    address_from: str
    unexpected_address: bool
    models: list[str]


def _project_providers(config: ProjectConfig | None) -> dict[str, tuple[str | None, list[str]]]:
    """provider -> (configured address, models) for the project's models."""
    if config is None:
        return {}
    models = {config.default_model, *config.models.values(), *config.unit_models.values()}
    found: dict[str, tuple[str | None, list[str]]] = {}
    for model in sorted(models):
        provider = model.split("/", 1)[0] if "/" in model else "openai"
        address, names = found.get(provider, (config.api_base_for(model), []))
        found[provider] = (address, [*names, model])
    return found


def key_statuses(config: ProjectConfig | None = None) -> list[KeyStatus]:
    """Every provider that has a key, plus (with a project's config) every provider its
    models use: where the key comes from and the address the calls will go to."""
    used = _project_providers(config)
    rows = []
    for provider in sorted(set(keys.known_providers()) | set(used)):
        source = None if provider in keys.KEYLESS_PROVIDERS else keys.key_source(provider)
        if source is None and provider not in used:
            continue
        configured, models = used.get(provider, (None, []))
        address, origin = keys.provider_address(provider, configured=configured)
        rows.append(KeyStatus(
            provider=provider,
            key=("not needed" if provider in keys.KEYLESS_PROVIDERS else
                 f"environment {keys.env_var_name(provider)}" if source == "env" else
                 "OS keyring" if source == "keyring" else "missing"),
            address=address, address_from=origin,
            unexpected_address=bool(source) and keys.unexpected_address(provider, address),
            models=models))
    return rows


class KeyCheck(BaseModel):
    """The outcome of one tiny call made with a provider's key (``keepstep keys test``)."""

    ok: bool
    provider: str
    model: str
    address: str
    address_from: str
    latency_ms: int = 0
    key_from: str | None = None  # "environment OPENAI_API_KEY" | "the OS keyring"
    error: str = ""


class _NoLedger:
    """A ledger for a call that belongs to no run: nothing is recorded anywhere."""

    def reserve(self, ctx: object, **_: object) -> str:
        return "keys-test"

    def settle(self, call_id: str, **_: object) -> None:
        pass


def check_key(provider: str, *, model: str | None = None,
              config: ProjectConfig | None = None, send_anywhere: bool = False) -> KeyCheck:
    """Make one tiny call with the provider's key and say whether it answered (costs a
    fraction of a cent on a paid provider; nothing is recorded in any run). The address is
    the project's (``config``: its ``api_bases``/``api_base``), else the environment's, else
    litellm's default. Raises KeepstepError when no model to test with is known, and — the
    key is never sent where nobody named it — when the key would go to an address that is
    neither the provider's own, nor this machine, nor named by the project's keepstep.toml,
    unless ``send_anywhere``."""
    from keepstep.engine.errors import KeepstepError, ModelError
    from keepstep.engine.gateway.client import CallContext, ModelGateway, ModelRequest
    from keepstep.engine.gateway.prompts import input_block

    configured, models = _project_providers(config).get(provider, (None, []))
    model = model or (models[0] if models else keys.TEST_MODELS.get(provider))
    if model is None:
        raise KeepstepError(f"no model to test {provider} with", hint="pass --model "
                            "PROVIDER/MODEL")
    if configured is None and config is not None:  # a provider none of its models use
        configured = config.api_base_for(f"{provider}/{model.split('/', 1)[-1]}")
    address, origin = keys.provider_address(provider, configured=configured)
    if not send_anywhere and origin != "keepstep.toml" and keys.key_source(provider) and \
            keys.unexpected_address(provider, address):
        namer = "no project" if config is None else "not the project"
        raise KeepstepError(
            f"the {provider} key would be sent to {address} ({origin}): not {provider}'s own "
            f"address, not this machine, and {namer} names it; nothing was sent",
            hint="set api_base in the project's keepstep.toml if that address is intended, or "
            "pass --yes to send the key there once")
    request = ModelRequest(
        model=model, max_tokens=16, timeout_s=30, api_base=configured,
        messages=[{"role": "system", "content": "Answer with one JSON object."},
                  {"role": "user", "content": "TASK\nReply with {\"problems\": []}.\n\n"
                   + input_block({"task": "check", "evidence_ids_known": [], "claims": []})}])
    source = keys.key_source(provider)
    key_from = (None if source is None else f"environment {keys.env_var_name(provider)}"
                if source == "env" else "the OS keyring")
    started = time.monotonic()
    try:
        ModelGateway(ledger=_NoLedger()).complete(
            CallContext(run_id="keys-test", unit="keys-test", attempt="keys-test/a1"), request)
    except ModelError as exc:
        return KeyCheck(ok=False, provider=provider, model=model, address=address,
                        address_from=origin, key_from=key_from, error=exc.message)
    return KeyCheck(ok=True, provider=provider, model=model, address=address,
                    address_from=origin, key_from=key_from,
                    latency_ms=round((time.monotonic() - started) * 1000))


def model_findings(files: ProjectFiles) -> list[ModelFinding]:
    """``check_project_models`` for every unit of the project's plan that calls a model."""
    from keepstep.engine.core.changes import prompt_refs

    units = [(u.id, u.kind.value) for u in files.plan.units if prompt_refs(u)]
    return check_project_models(files.config, units)


__all__ = ["KeyCheck", "KeyStatus", "ModelFinding", "check_key", "check_model",
           "check_project_models", "key_statuses", "model_findings"]
