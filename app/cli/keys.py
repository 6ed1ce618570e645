"""API keys from the command line, beside ``keys set`` (in records.py): ``keys list``,
``keys status``, ``keys delete`` and ``keys test``.

No command prints a key. ``status`` shows, for each provider that has a key or that the
project's models use, where the key comes from and the address the calls will go to —
keepstep.toml's ``api_base``/``api_bases``, else the environment variable litellm honours
(``OPENAI_API_BASE`` and friends), else litellm's default — and flags a key that would go
to an unexpected address.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import EXIT_RUNTIME, JsonOpt, UsageProblem, add_command, check_dir

ProviderArg = Annotated[str, typer.Argument(help="e.g. openai, anthropic.")]
ProjectOpt = Annotated[Path | None, typer.Option(
    "--project", help="A project folder: also list the providers its models use, at the "
    "addresses its keepstep.toml sets.")]


def _project_providers(root: Path | None) -> dict[str, tuple[str | None, list[str]]]:
    """provider -> (configured address, models) for the project's models."""
    if root is None:
        return {}
    from keepstep.engine.files.project import load_config

    config = load_config(check_dir(root))
    models = {config.default_model, *config.models.values(), *config.unit_models.values()}
    found: dict[str, tuple[str | None, list[str]]] = {}
    for model in sorted(models):
        provider = model.split("/", 1)[0] if "/" in model else "openai"
        address, names = found.get(provider, (config.api_base_for(model), []))
        found[provider] = (address, [*names, model])
    return found


def _rows(root: Path | None) -> list[dict[str, Any]]:
    from keepstep.engine.gateway import keys

    used = _project_providers(root)
    rows = []
    for provider in sorted(set(keys.known_providers()) | set(used)):
        source = None if provider in keys.KEYLESS_PROVIDERS else keys.key_source(provider)
        if source is None and provider not in used:
            continue
        configured, models = used.get(provider, (None, []))
        address, origin = keys.provider_address(provider, configured=configured)
        rows.append({
            "provider": provider,
            "key": ("not needed" if provider in keys.KEYLESS_PROVIDERS else
                    f"environment {keys.env_var_name(provider)}" if source == "env" else
                    "OS keyring" if source == "keyring" else "missing"),
            "address": address, "address_from": origin,
            "unexpected_address": bool(source) and keys.unexpected_address(provider, address),
            "models": models,
        })
    return rows


def keys_status(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """Providers with a key (never the key), where each key comes from, and the address
    each provider will be called at."""
    rows = _rows(project)
    if as_json:
        typer.echo(out.to_json(rows))
        return
    if not rows:
        typer.echo("no provider has a key (environment or OS keyring); the offline model "
                   "local/keepstep-offline needs none")
        return
    for r in rows:
        line = f"{r['provider']}: key {r['key']} · calls go to {r['address']} ({r['address_from']})"
        if r["models"]:
            line += f" · used by {', '.join(r['models'])}"
        typer.echo(line)
        if r["unexpected_address"]:
            typer.echo(f"  warning: the {r['provider']} key is sent to {r['address']}, not the "
                       "provider's own address — check that this is intended")


def keys_list(as_json: JsonOpt = False) -> None:
    """The providers that have a key, and where it comes from (never the key)."""
    rows = [r for r in _rows(None) if r["key"] not in ("missing", "not needed")]
    if as_json:
        typer.echo(out.to_json([{"provider": r["provider"], "key": r["key"]} for r in rows]))
        return
    typer.echo("\n".join(f"{r['provider']}: {r['key']}" for r in rows)
               or "no provider has a key (environment or OS keyring)")


def keys_delete(provider: ProviderArg) -> None:
    """Remove a provider's key from the OS keyring (the environment is left alone)."""
    from keepstep.engine.gateway import keys

    if keys.delete_api_key(provider):
        typer.echo(f"removed the key for {provider} from the OS keyring")
    else:
        typer.echo(f"the OS keyring holds no key for {provider}")
    if keys.key_source(provider) == "env":
        typer.echo(f"note: {keys.env_var_name(provider)} is still set in this environment and "
                   "takes precedence")


def keys_test(provider: ProviderArg,
              model: Annotated[str | None, typer.Option(
                  "--model", help="The model to ask (default: the project's, or a small one "
                  "of the provider).")] = None,
              project: ProjectOpt = None) -> None:
    """Make one tiny call with the provider's key and say whether it answered (costs a
    fraction of a cent on a paid provider; nothing is recorded in any run)."""
    from keepstep.engine.errors import ModelError
    from keepstep.engine.gateway import keys
    from keepstep.engine.gateway.client import CallContext, ModelGateway, ModelRequest
    from keepstep.engine.gateway.prompts import input_block

    used = _project_providers(project)
    configured, models = used.get(provider, (None, []))
    model = model or (models[0] if models else keys.TEST_MODELS.get(provider))
    if model is None:
        raise UsageProblem(f"no model to test {provider} with", "pass --model PROVIDER/MODEL")
    address, origin = keys.provider_address(provider, configured=configured)

    class _NoLedger:
        def reserve(self, ctx: Any, **_: Any) -> str:
            return "keys-test"

        def settle(self, call_id: str, **_: Any) -> None:
            pass

    request = ModelRequest(
        model=model, max_tokens=16, timeout_s=30, api_base=configured,
        messages=[{"role": "system", "content": "Answer with one JSON object."},
                  {"role": "user", "content": "TASK\nReply with {\"problems\": []}.\n\n"
                   + input_block({"task": "check", "evidence_ids_known": [], "claims": []})}])
    started = time.monotonic()
    try:
        ModelGateway(ledger=_NoLedger()).complete(
            CallContext(run_id="keys-test", unit="keys-test", attempt="keys-test/a1"), request)
    except ModelError as exc:
        typer.echo(f"error: {model} at {address} ({origin}): {str(exc).splitlines()[0]}",
                   err=True)
        raise typer.Exit(EXIT_RUNTIME) from None
    ms = round((time.monotonic() - started) * 1000)
    source = keys.key_source(provider)
    typer.echo(f"ok: {model} answered at {address} ({origin}) in {ms} ms"
               + (f"; key from {'environment ' + keys.env_var_name(provider) if source == 'env' else 'the OS keyring'}"  # noqa: E501
                  if source else ""))


def register_keys(keys_app: typer.Typer) -> None:
    add_command(keys_app, keys_list, "list")
    add_command(keys_app, keys_status, "status")
    add_command(keys_app, keys_delete, "delete")
    add_command(keys_app, keys_test, "test")
