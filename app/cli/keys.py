"""API keys from the command line, beside ``keys set`` (in records.py): ``keys list``,
``keys status``, ``keys delete`` and ``keys test``.

No command prints a key. ``status`` shows, for each provider that has a key or that the
project's models use, where the key comes from and the address the calls will go to —
keepstep.toml's ``api_base``/``api_bases``, else the environment variable litellm honours
(``OPENAI_API_BASE`` and friends), else litellm's default — and flags a key that would go
to an unexpected address.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import EXIT_RUNTIME, JsonOpt, UsageProblem, add_command, check_dir
from keepstep.app.cli.output import find_project

if TYPE_CHECKING:
    from keepstep.engine.keys import KeyStatus

ProviderArg = Annotated[str, typer.Argument(help="e.g. openai, anthropic.")]
ProjectOpt = Annotated[Path | None, typer.Option(
    "--project", help="A project folder (default: the one holding the working directory, "
    "as for every command): also list the providers its models use, at the addresses its "
    "keepstep.toml sets.")]


def _project_root(root: Path | None) -> Path | None:
    """``--project``, else the project the working directory is in (like every other
    command), else None."""
    return check_dir(root) if root is not None else find_project()


def _config(root: Path | None):  # noqa: ANN202 - engine.ProjectConfig, imported lazily
    from keepstep.engine import load_config

    found = _project_root(root)
    return load_config(found) if found is not None else None


def _rows(root: Path | None, *, project: bool = True) -> list[KeyStatus]:
    from keepstep.engine.keys import key_statuses

    return key_statuses(_config(root) if project else None)


def keys_status(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """Providers with a key (never the key), where each key comes from, and the address
    each provider will be called at."""
    rows = _rows(project)
    if as_json:
        typer.echo(out.to_json([r.model_dump(mode="json") for r in rows]))
        return
    if project is not None:  # which store the project uses, and its password's source
        from keepstep.engine.store import store_summary

        summary = store_summary(check_dir(project))
        typer.echo(f"store: {summary.where}"
                   + (f" · password from {summary.password_from}"
                      if summary.backend != "sqlite" else ""))
    if not rows:
        typer.echo("no provider has a key (environment or OS keyring); the offline model "
                   "local/keepstep-offline needs none")
        return
    for r in rows:
        line = f"{r.provider}: key {r.key} · calls go to {r.address} ({r.address_from})"
        if r.models:
            line += f" · used by {', '.join(r.models)}"
        typer.echo(line)
        if r.unexpected_address:
            typer.echo(f"  warning: the {r.provider} key is sent to {r.address}, not the "
                       "provider's own address — check that this is intended")


def keys_list(as_json: JsonOpt = False) -> None:
    """The providers that have a key, and where it comes from (never the key)."""
    rows = [r for r in _rows(None, project=False) if r.key not in ("missing", "not needed")]
    if as_json:
        typer.echo(out.to_json([{"provider": r.provider, "key": r.key} for r in rows]))
        return
    typer.echo("\n".join(f"{r.provider}: {r.key}" for r in rows)
               or "no provider has a key (environment or OS keyring)")


def keys_delete(provider: ProviderArg) -> None:
    """Remove a provider's key from the OS keyring (the environment is left alone)."""
    from keepstep.engine.keys import delete_api_key, env_var_name, key_source

    if delete_api_key(provider):
        typer.echo(f"removed the key for {provider} from the OS keyring")
    else:
        typer.echo(f"the OS keyring holds no key for {provider}")
    if key_source(provider) == "env":
        typer.echo(f"note: {env_var_name(provider)} is still set in this environment and "
                   "takes precedence")


def keys_test(provider: ProviderArg,
              model: Annotated[str | None, typer.Option(
                  "--model", help="The model to ask (default: the project's, or a small one "
                  "of the provider).")] = None,
              project: ProjectOpt = None,
              yes: Annotated[bool, typer.Option(
                  "--yes", help="Send the key even to an address neither the provider nor "
                  "the project names (e.g. from an environment variable).")] = False) -> None:
    """Make one tiny call with the provider's key and say whether it answered (costs a
    fraction of a cent on a paid provider; nothing is recorded in any run). Inside a
    project, the call goes to the address its keepstep.toml sets."""
    from keepstep.engine import KeepstepError
    from keepstep.engine.keys import check_key

    try:
        result = check_key(provider, model=model, config=_config(project), send_anywhere=yes)
    except KeepstepError as exc:
        raise UsageProblem(exc.message, exc.hint) from None
    if not result.ok:
        typer.echo(f"error: {result.model} at {result.address} ({result.address_from}): "
                   f"{result.error}", err=True)
        raise typer.Exit(EXIT_RUNTIME)
    key = f"; key from {result.key_from}" if result.key_from else ""
    typer.echo(f"ok: {result.model} answered at {result.address} ({result.address_from}) in "
               f"{result.latency_ms} ms{key}")


def register_keys(keys_app: typer.Typer) -> None:
    add_command(keys_app, keys_list, "list")
    add_command(keys_app, keys_status, "status")
    add_command(keys_app, keys_delete, "delete")
    add_command(keys_app, keys_test, "test")
